#include "distribute/cluster_spec.h"

#include "common/json_document.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "common/json_keys.h"
#include "io/safetensors.h"  // writeFileAtomically

#include <filesystem>

namespace ts {
namespace {

const std::vector<std::string> kRoles = {"chief", "worker", "ps", "evaluator"};

bool isRole(const std::string& r)
{
    for (const auto& k : kRoles)
        if (k == r) return true;
    return false;
}

// Normalised form of an address for duplicate detection: hosts compare case-insensitively, and
// the names of this machine's loopback interface are one host (localhost:7070 and
// 127.0.0.1:7070 are the same port on the same machine).
std::string addressKey(const HostPort& hp)
{
    std::string h = hp.host;
    for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (h == "localhost" || h == "127.0.0.1" || h == "::1" || h == "[::1]" || h == "localhost.localdomain") h = "loopback";
    return h + ":" + std::to_string(hp.port);
}

std::string hostKey(const HostPort& hp)
{
    const std::string k = addressKey(hp);
    return k.substr(0, k.rfind(':'));
}

Result<TaskId> parseTask(const nlohmann::json& t, const std::string& source)
{
    if (!t.is_object())
        return makeError(ErrorCode::ParseError, source + ": \"task\" must be an object like {\"type\": \"worker\", \"index\": 0}",
                         "name this process's role and its index in that role's list");
    TS_TRY(checkJsonKeys(t, {"type", "index", "trial"}, source + ": task"));
    if (!t.contains("type") || !t["type"].is_string())
        return makeError(ErrorCode::ParseError, source + ": task.type is missing or not a string",
                         "set task.type to one of chief, worker, ps, evaluator");
    TaskId id;
    id.type = t["type"].get<std::string>();
    if (!isRole(id.type))
        return makeError(ErrorCode::ParseError, source + ": task.type \"" + id.type + "\" is not a role",
                         "use chief, worker, ps or evaluator");
    if (t.contains("index")) {
        const auto& ix = t["index"];
        // TF_CONFIG writers sometimes quote the index; accept "1" as well as 1.
        if (ix.is_number_integer()) {
            id.index = ix.get<int>();
        } else if (ix.is_string()) {
            const std::string s = ix.get<std::string>();
            char* end = nullptr;
            const long v = std::strtol(s.c_str(), &end, 10);
            if (s.empty() || *end != '\0')
                return makeError(ErrorCode::ParseError, source + ": task.index \"" + s + "\" is not an integer",
                                 "the index is the task's position in its role's list, from 0");
            id.index = static_cast<int>(v);
        } else {
            return makeError(ErrorCode::ParseError, source + ": task.index must be an integer",
                             "the index is the task's position in its role's list, from 0");
        }
    }
    return id;
}

} // namespace

std::string HostPort::toString() const
{
    if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
    return host + ":" + std::to_string(port);
}

Result<HostPort> HostPort::parse(const std::string& text, bool allowPortZero)
{
    auto bad = [&](const std::string& why) {
        return makeError(ErrorCode::InvalidArgument, "bad address \"" + text + "\": " + why,
                         "write host:port, e.g. 10.0.0.2:2222 or [::1]:2222");
    };
    HostPort hp;
    std::string portText;
    if (!text.empty() && text.front() == '[') {
        const auto close = text.find(']');
        if (close == std::string::npos) return bad("missing ']' after the IPv6 address");
        hp.host = text.substr(1, close - 1);
        if (close + 1 >= text.size() || text[close + 1] != ':') return bad("missing :port after ']'");
        portText = text.substr(close + 2);
    } else {
        const auto colon = text.rfind(':');
        if (colon == std::string::npos) return bad("no :port");
        hp.host = text.substr(0, colon);
        if (hp.host.find(':') != std::string::npos) return bad("IPv6 hosts need brackets");
        portText = text.substr(colon + 1);
    }
    if (hp.host.empty()) return bad("empty host");
    for (char c : hp.host)
        if (std::isspace(static_cast<unsigned char>(c)) || c == '/' || c == '@') return bad("the host contains '" + std::string(1, c) + "'");
    if (portText.empty() || portText.size() > 5) return bad("the port must be a number in 1..65535");
    for (char c : portText)
        if (c < '0' || c > '9') return bad("the port must be a number in 1..65535");
    hp.port = std::stoi(portText);
    if (hp.port > 65535 || (hp.port == 0 && !allowPortZero)) return bad("the port must be a number in 1..65535");
    return hp;
}

const std::vector<std::string>& ClusterSpec::roles() { return kRoles; }

Result<ClusterSpec> ClusterSpec::fromJson(const nlohmann::json& j, const std::string& source)
{
    if (!j.is_object())
        return makeError(ErrorCode::ParseError, source + ": TF_CONFIG must be a JSON object with \"cluster\" and \"task\"",
                         "e.g. {\"cluster\": {\"worker\": [\"host1:2222\", \"host2:2222\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}");
    TS_TRY(checkJsonKeys(j, {"cluster", "task", "environment", "rpc_layer"}, source));
    if (!j.contains("cluster") || !j["cluster"].is_object())
        return makeError(ErrorCode::ParseError, source + ": \"cluster\" is missing or not an object",
                         "write \"cluster\": {\"worker\": [\"host:port\", ...]} (roles: chief, worker, ps, evaluator)");
    ClusterSpec spec;
    spec.m_source = source;
    std::map<std::string, std::pair<std::string, std::string>> seen;  // address key -> "role[index]", as written
    for (auto it = j["cluster"].begin(); it != j["cluster"].end(); ++it) {
        const std::string role = it.key();
        if (!isRole(role))
            return makeError(ErrorCode::ParseError, source + ": cluster has an unknown role \"" + role + "\"",
                             "roles are chief, worker, ps and evaluator");
        if (!it.value().is_array())
            return makeError(ErrorCode::ParseError, source + ": cluster." + role + " must be a list of \"host:port\" strings",
                             "e.g. \"" + role + "\": [\"host1:2222\", \"host2:2222\"]");
        std::vector<std::string> list;
        for (std::size_t i = 0; i < it.value().size(); ++i) {
            const auto& e = it.value()[i];
            const std::string where = source + ": cluster." + role + "[" + std::to_string(i) + "]";
            if (!e.is_string())
                return makeError(ErrorCode::ParseError, where + " must be a \"host:port\" string, not " + e.dump(),
                                 "write each address in quotes, e.g. \"host1:2222\"");
            auto hp = HostPort::parse(e.get<std::string>());
            if (!hp.ok()) {
                Error err = hp.takeError();
                err.message = where + ": " + err.message;
                return err;
            }
            const std::string key = addressKey(*hp);
            const std::string name = role + "[" + std::to_string(i) + "]";
            const std::string written = e.get<std::string>();
            if (auto prev = seen.find(key); prev != seen.end()) {
                // Written differently (localhost and 127.0.0.1): say both, or it reads as a typo.
                const auto& [prevName, prevWritten] = prev->second;
                return makeError(ErrorCode::InvalidArgument,
                                 source + ": address " + written + " is used twice, by cluster." + prevName +
                                     (prevWritten != written ? " (written " + prevWritten + ")" : std::string()) + " and cluster." + name,
                                 "every task needs its own host:port");
            }
            seen[key] = {name, written};
            list.push_back(e.get<std::string>());
        }
        if ((role == "chief" || role == "evaluator") && list.size() > 1)
            return makeError(ErrorCode::InvalidArgument,
                             source + ": cluster." + role + " has " + std::to_string(list.size()) + " entries; there can be at most one " + role,
                             role == "chief" ? "keep one chief and list the others under \"worker\"" : "keep one evaluator; it evaluates every checkpoint");
        if (!list.empty()) spec.m_jobs[role] = std::move(list);
    }
    if (spec.m_jobs.empty())
        return makeError(ErrorCode::InvalidArgument, source + ": the cluster lists no tasks",
                         "add at least \"worker\": [\"host:port\"]");
    for (const char* k : {"environment", "rpc_layer"})
        if (j.contains(k)) spec.m_extra[k] = j[k];
    if (j.contains("task")) {
        TS_ASSIGN(TaskId task, parseTask(j["task"], source));
        TS_ASSIGN(spec, spec.withTask(task));
    }
    return spec;
}

Result<ClusterSpec> ClusterSpec::fromText(const std::string& text, const std::string& source)
{
    auto j = parseJsonDocument(text, source);
    if (!j.ok()) {
        Error e = j.takeError();
        e.hint += (e.hint.empty() ? "" : "; ") + std::string("TF_CONFIG is a JSON object: {\"cluster\": {...}, \"task\": {...}}");
        return e;
    }
    return fromJson(*j, source);
}

Result<ClusterSpec> ClusterSpec::fromFile(const std::string& path)
{
    TS_ASSIGN(std::string text, readTextFile(path, "cluster file (TF_CONFIG)"));
    return fromText(text, path);
}

Result<ClusterSpec> ClusterSpec::fromEnvironment()
{
    const char* v = std::getenv("TF_CONFIG");
    if (!v || !*v)
        return makeError(ErrorCode::NotFound, "TF_CONFIG is not set", "export TF_CONFIG, or pass --tf-config FILE (this process is one task) or --cluster FILE (coordinate worker daemons)");
    return fromText(v, "TF_CONFIG");
}

nlohmann::json ClusterSpec::toJson() const
{
    nlohmann::json j = m_extra;
    nlohmann::json cluster = nlohmann::json::object();
    for (const auto& [role, list] : m_jobs) cluster[role] = list;
    j["cluster"] = cluster;
    if (m_hasTask) j["task"] = {{"type", m_task.type}, {"index", m_task.index}};
    return j;
}

Result<ClusterSpec> ClusterSpec::withTask(const TaskId& task) const
{
    if (!isRole(task.type))
        return makeError(ErrorCode::InvalidArgument, m_source + ": task type \"" + task.type + "\" is not a role",
                         "use chief, worker, ps or evaluator");
    const int n = count(task.type);
    if (n == 0)
        return makeError(ErrorCode::InvalidArgument, m_source + ": task " + task.toString() + " but the cluster has no \"" + task.type + "\" entries",
                         "add the " + task.type + " address to cluster." + task.type + " or fix task.type");
    if (task.index < 0 || task.index >= n)
        return makeError(ErrorCode::InvalidArgument,
                         m_source + ": task.index " + std::to_string(task.index) + " is out of range for " + task.type + " (" + std::to_string(n) + " entr" + (n == 1 ? "y" : "ies") + ")",
                         "use an index in 0.." + std::to_string(n - 1));
    ClusterSpec c = *this;
    c.m_task = task;
    c.m_hasTask = true;
    return c;
}

Result<std::string> ClusterSpec::tfConfigFor(const TaskId& task) const
{
    TS_ASSIGN(ClusterSpec c, withTask(task));
    return c.toJson().dump();
}

Result<TaskId> parseTaskId(const std::string& text)
{
    const auto colon = text.find(':');
    TaskId t;
    t.type = text.substr(0, colon);
    // Digits only after the colon: stoi would take " 0" and "-1" too.
    const std::string index = colon == std::string::npos ? std::string() : text.substr(colon + 1);
    const bool digits = !index.empty() && index.size() <= 6 && std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (t.type.empty() || !digits)
        return makeError(ErrorCode::InvalidArgument, "'" + text + "': expected type:index", "e.g. worker:1 or chief:0");
    t.index = std::stoi(index);
    return t;
}

std::vector<TaskId> ClusterSpec::tasks() const
{
    std::vector<TaskId> out;
    for (const auto& role : roles())
        for (int i = 0; i < count(role); ++i) out.push_back({role, i});
    return out;
}

std::string ClusterSpec::tfConfigFileName(const TaskId& task)
{
    return "tf_config-" + task.type + "-" + std::to_string(task.index) + ".json";
}

Result<std::vector<std::string>> ClusterSpec::writeTfConfigs(const std::string& dir) const
{
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || !std::filesystem::is_directory(dir))
        return makeError(ErrorCode::IoError, "cannot make the folder " + dir + (ec ? ": " + ec.message() : std::string()),
                         "choose a folder this user can write");
    std::vector<std::string> written;
    for (const TaskId& t : tasks()) {
        TS_ASSIGN(std::string text, tfConfigFor(t));
        text += "\n";
        const std::string path = (std::filesystem::path(dir) / tfConfigFileName(t)).string();
        if (Status st = writeFileAtomically(path, {text}); !st.ok()) return st.takeError();
        written.push_back(path);
    }
    return written;
}

Status ClusterSpec::validateFor(const std::string& strategy) const
{
    if (strategy == "multi-worker-mirrored" || strategy == "multi_worker_mirrored" || strategy == "multiworkermirrored") {
        if (numTrainingWorkers() == 0)
            return makeError(ErrorCode::InvalidArgument, m_source + ": multi-worker-mirrored needs a chief or workers, the cluster has none",
                             "add \"worker\": [\"host:port\", ...]");
        if (count("ps") > 0)
            return makeError(ErrorCode::InvalidArgument, m_source + ": multi-worker-mirrored does not use ps tasks, but the cluster lists " + std::to_string(count("ps")),
                             "remove cluster.ps, or use the parameter-server strategy");
        return okStatus();
    }
    if (strategy == "parameter-server" || strategy == "parameter_server" || strategy == "parameterserver") {
        if (count("ps") == 0)
            return makeError(ErrorCode::InvalidArgument, m_source + ": parameter-server needs at least one ps task, the cluster has none",
                             "add \"ps\": [\"host:port\"]");
        if (count("worker") == 0)
            return makeError(ErrorCode::InvalidArgument, m_source + ": parameter-server needs at least one worker task, the cluster has none",
                             "add \"worker\": [\"host:port\", ...]");
        return okStatus();
    }
    return makeError(ErrorCode::InvalidArgument, "strategy \"" + strategy + "\" does not run on a cluster",
                     "use multi-worker-mirrored or parameter-server with a cluster");
}

const std::vector<std::string>& ClusterSpec::addresses(const std::string& role) const
{
    static const std::vector<std::string> empty;
    auto it = m_jobs.find(role);
    return it == m_jobs.end() ? empty : it->second;
}

Result<std::string> ClusterSpec::address(const TaskId& task) const
{
    const auto& list = addresses(task.type);
    if (task.index < 0 || task.index >= static_cast<int>(list.size()))
        return makeError(ErrorCode::InvalidArgument, m_source + ": the cluster has no task " + task.toString());
    return list[static_cast<std::size_t>(task.index)];
}

std::vector<TaskId> ClusterSpec::trainingTasks() const
{
    std::vector<TaskId> out;
    for (int i = 0; i < count("chief"); ++i) out.push_back({"chief", i});
    for (int i = 0; i < count("worker"); ++i) out.push_back({"worker", i});
    return out;
}

Result<int> ClusterSpec::trainingRank(const TaskId& task) const
{
    const auto tasks = trainingTasks();
    for (std::size_t i = 0; i < tasks.size(); ++i)
        if (tasks[i] == task) return static_cast<int>(i);
    return makeError(ErrorCode::InvalidArgument, m_source + ": task " + task.toString() + " is not a training worker of this cluster",
                     "only chief and worker tasks take part in synchronous training");
}

TaskId ClusterSpec::coordinator() const
{
    if (count("chief") > 0) return {"chief", 0};
    return {"worker", 0};
}

int ClusterSpec::trainingTasksSharingHost(const TaskId& task) const
{
    auto self = address(task);
    if (!self.ok()) return 1;
    auto mine = HostPort::parse(*self);
    if (!mine.ok()) return 1;
    int n = 0;
    for (const TaskId& t : trainingTasks()) {
        auto a = address(t);
        if (!a.ok()) continue;
        auto hp = HostPort::parse(*a);
        if (hp.ok() && hostKey(*hp) == hostKey(*mine)) ++n;
    }
    return std::max(1, n);
}

} // namespace ts
