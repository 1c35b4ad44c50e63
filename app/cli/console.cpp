#include <iostream>

#include "commands.h"
#include "common/result.h"
#include "common/utf8.h"

namespace tscli {

void printError(const ts::Error& e)
{
    std::cerr << "error: " << ts::printableText(e.message) << "\n";
    if (!e.hint.empty()) std::cerr << "hint: " << ts::printableText(e.hint) << "\n";
}

} // namespace tscli
