#pragma once
// Command-line parsing shared by trainstudio-cli and trainstudio-worker.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace tsapp {

// A count given on the command line: a whole number >= 0 (0 usually means "no limit"). CLI11's
// NonNegativeNumber says "not in range 0.000000 to 1797693134862315708145...".
inline CLI::Validator wholeNumberAtLeastZero()
{
    return CLI::Validator(
        [](std::string& value) -> std::string {
            std::size_t used = 0;
            long long n = -1;
            try {
                n = std::stoll(value, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            if (used != value.size() || n < 0) return "must be a whole number >= 0, got '" + value + "'";
            return {};
        },
        "N>=0", "whole number >= 0");
}

// Parses argv into `app`. Returns nothing when the command should run, else the exit code:
// --help and --version print and give 0; a bad option or value is bad input like any other
// (exit 2, an `error:` line and a `hint:` naming the --help to read), not CLI11's own codes
// (105, 109...) and wording, so scripts see one convention.
// Also refused: an option given an empty value (`--token-file "$UNSET"`), which would otherwise
// read as the option left out and quietly take its default.
inline std::optional<int> parseCommandLine(CLI::App& app, const char* program, int argc, char** argv)
{
    // The command chosen (or where the bad option was), e.g. "trainstudio-cli train".
    auto chosenCommand = [&](std::vector<const CLI::App*>* apps) {
        std::string command = program;
        for (const CLI::App* at = &app;;) {
            if (apps) apps->push_back(at);
            const auto chosen = at->get_subcommands();
            if (chosen.empty()) break;
            at = chosen.front();
            command += " " + at->get_name();
        }
        return command;
    };
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
        std::fprintf(stderr, "error: %s\nhint: %s --help lists the options and the values they take\n", e.what(),
                     chosenCommand(nullptr).c_str());
        return 2;
    }
    std::vector<const CLI::App*> apps;
    const std::string command = chosenCommand(&apps);
    for (const CLI::App* at : apps)
        for (const CLI::Option* option : at->get_options())
            if (option->count() > 0 && option->get_type_size() > 0)
                for (const std::string& value : option->results())
                    if (value.find_first_not_of(" \t\r\n") == std::string::npos) {
                        const std::string name = option->nonpositional() ? option->get_name() : "the " + option->get_name() + " argument";
                        std::fprintf(stderr, "error: %s was given an empty value\nhint: give it a value (an unset shell variable?), or leave it out; %s --help\n",
                                     name.c_str(), command.c_str());
                        return 2;
                    }
    return std::nullopt;
}

} // namespace tsapp
