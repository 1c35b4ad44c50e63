#include "data/csv.h"

#include "common/paths.h"
#include "common/utf8.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <deque>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

namespace ts {

namespace {

// Splits one line into fields (views into the line, or into `unquoted` for quoted fields; a
// deque keeps those strings in place). Returns false (with the 1-based column in errColumn) for
// a quote that is not closed on this line or text after a closing quote.
bool splitFields(const char* p, std::size_t n, char delim, std::vector<std::string_view>& fields,
                 std::deque<std::string>& unquoted, std::size_t& errColumn)
{
    fields.clear();
    unquoted.clear();
    std::size_t i = 0;
    for (;;) {
        if (i < n && p[i] == '"') {
            std::string v;
            ++i;
            bool closed = false;
            while (i < n) {
                if (p[i] == '"') {
                    if (i + 1 < n && p[i + 1] == '"') {
                        v += '"';
                        i += 2;
                        continue;
                    }
                    ++i;
                    closed = true;
                    break;
                }
                v += p[i++];
            }
            if (!closed || (i < n && p[i] != delim)) {
                errColumn = fields.size() + 1;
                return false;
            }
            unquoted.push_back(std::move(v));
            fields.emplace_back(unquoted.back());
        } else {
            const std::size_t start = i;
            while (i < n && p[i] != delim) ++i;
            fields.emplace_back(p + start, i - start);
        }
        if (i >= n) break;
        ++i;  // the delimiter
        if (i == n) {
            fields.emplace_back();  // a trailing delimiter: one more (empty) field
            break;
        }
    }
    return true;
}

std::string_view trim(std::string_view s)
{
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

bool parseFloat(std::string_view s, float& out)
{
    s = trim(s);
    if (s.empty()) return false;
    if (s.front() == '+') s.remove_prefix(1);
    const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
    if (r.ec == std::errc::result_out_of_range) {
        // Denormal or huge: let strtof decide (it returns 0, or inf with ERANGE: refused as not finite).
        std::string tmp(s);
        out = std::strtof(tmp.c_str(), nullptr);
        return true;
    }
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

std::string shown(std::string_view s)
{
    std::string out(1, '\'');
    out.append(printableText(s.substr(0, s.size() > 40 ? 37 : s.size())));
    out.append(s.size() > 40 ? "...'" : "'");
    return out;
}

} // namespace

CsvReader::~CsvReader()
{
    if (m_file) std::fclose(m_file);
    std::free(m_buf);
}

bool CsvReader::readLine(std::string_view& line)
{
    const ssize_t n = ::getline(&m_buf, &m_bufCap, m_file);
    if (n < 0) return false;
    ++m_line;
    std::size_t len = static_cast<std::size_t>(n);
    while (len > 0 && (m_buf[len - 1] == '\n' || m_buf[len - 1] == '\r')) --len;
    line = std::string_view(m_buf, len);
    return true;
}

Result<std::unique_ptr<CsvReader>> CsvReader::open(const std::string& path, const CsvOptions& options)
{
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
        return makeError(ErrorCode::NotFound, "CSV file '" + path + "' does not exist", missingFileHint(path));
    if (std::filesystem::is_directory(path, ec))
        return makeError(ErrorCode::InvalidArgument, "'" + path + "' is a folder, not a CSV file",
                         "name the .csv files inside it in \"paths\"");
    std::unique_ptr<CsvReader> r(new CsvReader);
    r->m_path = path;
    r->m_options = options;
    r->m_file = std::fopen(path.c_str(), "rb");
    if (!r->m_file) return makeError(ErrorCode::IoError, "cannot open CSV file '" + path + "': " + std::strerror(errno));

    std::string header;
    bool got = false;
    std::string_view text;
    while (r->readLine(text)) {
        if (!trim(text).empty()) {
            header.assign(text);
            got = true;
            break;
        }
    }
    if (!got)
        return makeError(ErrorCode::ParseError, "CSV file '" + path + "' is empty: expected a header line with column names");
    if (r->m_line == 1 && header.size() >= 3 && static_cast<unsigned char>(header[0]) == 0xEF &&
        static_cast<unsigned char>(header[1]) == 0xBB && static_cast<unsigned char>(header[2]) == 0xBF)
        header.erase(0, 3);  // UTF-8 byte order mark
    // Column names reach messages, the run's JSON and the studio: a header of binary or escape
    // sequences means this is not the CSV file the user meant.
    for (std::size_t i = 0; i < header.size(); ++i) {
        const auto b = static_cast<unsigned char>(header[i]);
        if ((b < 0x20 && b != '\t' && b != '\r') || b == 0x7F) {
            char hex[8];
            std::snprintf(hex, sizeof hex, "0x%02x", b);
            return makeError(ErrorCode::ParseError,
                             "CSV file '" + path + "' line " + std::to_string(r->m_line) + ": the header holds the control byte " + hex +
                                 " at byte " + std::to_string(i + 1) + ", so this is not a CSV text file",
                             "a CSV file starts with a line of column names (e.g. label,pixel1,pixel2); check the path");
        }
    }
    // getline splits at LF: a file whose lines end in CR alone (classic Mac) is one long line.
    if (header.find('\r') != std::string::npos)
        return makeError(ErrorCode::ParseError,
                         "CSV file '" + path + "' ends its lines with a carriage return (CR) alone, so it reads as one line",
                         "convert its line ends to LF or CRLF (e.g. tr '\\r' '\\n' < in.csv > out.csv)");
    if (!isValidUtf8(header))
        return makeError(ErrorCode::ParseError,
                         "CSV file '" + path + "' line " + std::to_string(r->m_line) + ": the header is not UTF-8 text",
                         "save the file as UTF-8 (iconv -f latin1 -t utf-8), or check the path");
    std::vector<std::string_view> fields;
    std::deque<std::string> unquoted;
    std::size_t errCol = 0;
    if (!splitFields(header.data(), header.size(), options.delimiter, fields, unquoted, errCol))
        return makeError(ErrorCode::ParseError, "CSV file '" + path + "' line " + std::to_string(r->m_line) + ", column " +
                                                    std::to_string(errCol) + ": unterminated or misplaced quote in the header");
    std::map<std::string, int> index;
    for (std::size_t c = 0; c < fields.size(); ++c) {
        std::string name(trim(fields[c]));
        if (index.count(name))
            return makeError(ErrorCode::ParseError, "CSV file '" + path + "' header: column name '" + name +
                                                        "' appears twice (columns " + std::to_string(index[name] + 1) + " and " +
                                                        std::to_string(c + 1) + ")",
                             "rename one of them");
        index[name] = static_cast<int>(c);
        r->m_header.push_back(name);
    }
    r->m_columns = fields.size();
    auto columnList = [&] {
        std::string s;
        const std::size_t shownCount = std::min<std::size_t>(r->m_header.size(), 20);
        for (std::size_t k = 0; k < shownCount; ++k) {
            const std::string& name = r->m_header[k];
            s += (s.empty() ? "" : ", ") + (name.size() > 60 ? name.substr(0, 57) + "..." : name);
        }
        if (shownCount < r->m_header.size()) s += ", ... (" + std::to_string(r->m_header.size()) + " columns)";
        return s;
    };
    const auto lit = index.find(options.labelColumn);
    if (lit == index.end() && r->m_header.size() == 1) {
        // One column whose name holds another separator: the delimiter is wrong, not the label.
        for (const char other : {',', ';', '\t', '|'})
            if (other != options.delimiter && r->m_header[0].find(other) != std::string::npos) {
                const std::string shownSep = other == '\t' ? std::string("\\t") : std::string(1, other);
                return makeError(ErrorCode::ParseError,
                                 "CSV file '" + path + "' has no label column '" + options.labelColumn + "': its header is one column, " +
                                     "split by '" + shownSep + "' rather than by the delimiter '" +
                                     (options.delimiter == '\t' ? std::string("\\t") : std::string(1, options.delimiter)) + "'",
                                 other == ',' ? std::string("leave \"delimiter\" out (',' is the default)")
                                              : "set \"delimiter\" to \"" + shownSep + "\"");
            }
    }
    if (lit == index.end())
        return makeError(ErrorCode::ParseError,
                         "CSV file '" + path + "' has no label column '" + options.labelColumn + "'",
                         "columns: " + columnList() + "; set label_column to one of them");
    r->m_labelCol = lit->second;
    r->m_role.assign(r->m_columns, -1);
    r->m_role[static_cast<std::size_t>(r->m_labelCol)] = -2;
    if (options.featureColumns.empty()) {
        for (std::size_t c = 0; c < r->m_columns; ++c)
            if (static_cast<int>(c) != r->m_labelCol) {
                r->m_role[c] = static_cast<int>(r->m_featureCols.size());
                r->m_featureCols.push_back(static_cast<int>(c));
                r->m_featureNames.push_back(r->m_header[c]);
            }
    } else {
        for (const auto& name : options.featureColumns) {
            const auto it = index.find(name);
            if (it == index.end())
                return makeError(ErrorCode::ParseError, "CSV file '" + path + "' has no feature column '" + name + "'",
                                 "columns: " + columnList());
            if (it->second == r->m_labelCol)
                return makeError(ErrorCode::InvalidArgument, "CSV file '" + path + "': column '" + name +
                                                                 "' is both the label and a feature");
            if (r->m_role[static_cast<std::size_t>(it->second)] >= 0)
                return makeError(ErrorCode::InvalidArgument, "CSV file '" + path + "': feature column '" + name + "' is listed twice");
            r->m_role[static_cast<std::size_t>(it->second)] = static_cast<int>(r->m_featureCols.size());
            r->m_featureCols.push_back(it->second);
            r->m_featureNames.push_back(name);
        }
    }
    if (r->m_featureCols.empty())
        return makeError(ErrorCode::ParseError, "CSV file '" + path + "' has no feature columns besides the label '" +
                                                    options.labelColumn + "'");
    return r;
}

Result<bool> CsvReader::nextLine(std::string_view& line)
{
    for (;;) {
        if (!readLine(line)) {
            if (std::ferror(m_file))
                return makeError(ErrorCode::IoError, "cannot read CSV file '" + m_path + "' after line " +
                                                         std::to_string(m_line) + ": " + std::strerror(errno));
            return false;
        }
        if (!trim(line).empty()) return true;
    }
}

Result<bool> CsvReader::skip()
{
    std::string_view line;
    return nextLine(line);
}

Result<std::optional<CsvRecord>> CsvReader::next()
{
    std::string_view line;  // in the read buffer, valid until the next read
    std::vector<std::string_view> fields;
    std::deque<std::string> unquoted;
    TS_ASSIGN(const bool more, nextLine(line));
    if (!more) return std::optional<CsvRecord>();
    const std::string at = "CSV file '" + m_path + "' line " + std::to_string(m_line);
    std::size_t errCol = 0;
    if (!splitFields(line.data(), line.size(), m_options.delimiter, fields, unquoted, errCol))
        return makeError(ErrorCode::ParseError, at + ", column " + std::to_string(errCol) + ": unterminated or misplaced quote",
                         "quoted fields may not span lines; double a quote inside quotes (\"\")");
    if (fields.size() != m_columns)
        return makeError(ErrorCode::ParseError,
                         at + ": ragged row with " + std::to_string(fields.size()) + " fields; the header has " +
                             std::to_string(m_columns),
                         fields.size() < m_columns ? "a value is missing (or a delimiter inside an unquoted field)"
                                                   : "an extra delimiter; quote fields that contain it");
    CsvRecord rec;
    rec.line = m_line;
    rec.features.resize(m_featureCols.size());
    for (std::size_t c = 0; c < m_columns; ++c) {
        const int role = m_role[c];
        if (role == -1) continue;
        float v = 0;
        if (!parseFloat(fields[c], v))
            return makeError(ErrorCode::ParseError,
                             at + ", column " + std::to_string(c + 1) + " ('" + m_header[c] + "'): " +
                                 (trim(fields[c]).empty() ? std::string("empty value") : shown(fields[c]) + " is not a number"),
                             role == -2 ? "labels must be numbers (class ids 0, 1, ...)" : "features must be numbers");
        if (!std::isfinite(v))
            // NaN and Inf ("nan", "inf", 1e999) would pass the loss check (ReLU zeroes a NaN) and
            // turn the first layer's weights to NaN while the run reports success.
            return makeError(ErrorCode::ParseError,
                             at + ", column " + std::to_string(c + 1) + " ('" + m_header[c] + "'): " + shown(fields[c]) +
                                 " is not a finite number",
                             "fill in or drop missing values before training, or set skip_bad_records to skip such lines");
        if (role == -2) {
            if (!m_options.floatLabels && (v < 0 || v != std::floor(v) || v > 2147483647.f))
                return makeError(ErrorCode::ParseError,
                                 at + ", column " + std::to_string(c + 1) + " ('" + m_header[c] + "'): label " +
                                     shown(fields[c]) + " is not a class id (an integer >= 0)",
                                 "map class names to 0, 1, ... or set label_type to \"float\" for regression");
            rec.label = v;
        } else {
            rec.features[static_cast<std::size_t>(role)] = v;
        }
    }
    return std::optional<CsvRecord>(std::move(rec));
}

Result<int64_t> CsvReader::countRecords(const std::string& path)
{
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return makeError(ErrorCode::IoError, "cannot open CSV file '" + path + "': " + std::strerror(errno));
    std::vector<char> buf(1 << 16);
    int64_t lines = 0;
    bool blank = true, header = true;
    for (;;) {
        const std::size_t n = std::fread(buf.data(), 1, buf.size(), f);
        if (n == 0) break;
        for (std::size_t i = 0; i < n; ++i) {
            const char ch = buf[i];
            if (ch == '\n') {
                if (!blank) {
                    if (header) header = false;
                    else ++lines;
                }
                blank = true;
            } else if (ch != '\r' && ch != ' ' && ch != '\t') {
                blank = false;
            }
        }
    }
    if (!blank && !header) ++lines;
    std::fclose(f);
    return lines;
}

} // namespace ts
