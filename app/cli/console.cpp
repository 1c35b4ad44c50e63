#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "commands.h"
#include "common/result.h"
#include "common/utf8.h"
#include "telemetry/tracer.h"

namespace tscli {

void printError(const ts::Error& e)
{
    std::cerr << "error: " << ts::printableText(e.message) << "\n";
    if (!e.hint.empty()) std::cerr << "hint: " << ts::printableText(e.hint) << "\n";
}

void clearProgressLine()
{
    // The bar is at most ~100 columns wide (train_command.cpp's ConsoleListener::onStep).
    if (isatty(STDERR_FILENO)) std::fputs(("\r" + std::string(110, ' ') + "\r").c_str(), stderr);
}

std::string unrecordedRunId(const std::string& prefix)
{
    return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(ts::telemetry::wallNowMicros());
}

} // namespace tscli
