#pragma once
// Command-line parsing shared by trainstudio-cli and trainstudio-worker.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <string>

namespace tsapp {

// Parses argv into `app`. Returns nothing when the command should run, else the exit code:
// --help and --version print and give 0; a bad option or value is bad input like any other
// (exit 2, an `error:` line and a `hint:` naming the --help to read), not CLI11's own codes
// (105, 109...) and wording, so scripts see one convention.
inline std::optional<int> parseCommandLine(CLI::App& app, const char* program, int argc, char** argv)
{
    try {
        app.parse(argc, argv);
        return std::nullopt;
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
        // The command the bad option belongs to, e.g. "trainstudio-cli train".
        std::string command = program;
        for (const CLI::App* at = &app;;) {
            const auto chosen = at->get_subcommands();
            if (chosen.empty()) break;
            at = chosen.front();
            command += " " + at->get_name();
        }
        std::fprintf(stderr, "error: %s\nhint: %s --help lists the options and the values they take\n", e.what(), command.c_str());
        return 2;
    }
}

} // namespace tsapp
