#pragma once
// Text for numbers and shapes as the designer shows them: compact on the canvas ("201K"),
// exact in the inspector ("200,960").

#include <QString>

#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace ts {

// "784", "28×28×1"; "?" for an empty (unknown) shape.
QString shapeText(const Shape& shape);
// "0", "950", "1.2K", "201K", "3.4M", "1.2G".
QString compactCount(int64_t n);
// "200,960" (locale-independent thousands separators, so screenshots and tests agree).
QString exactCount(int64_t n);
// A problem message without its "node 'id': " prefix (the node it is drawn on names itself).
QString problemTextForNode(const std::string& message, const std::string& nodeId);
QString toQString(const std::string& s);
// "1 layer", "3 layers" (English plurals; no translation files are shipped).
QString counted(int64_t n, const char* singular, const char* plural);
std::string toStdString(const QString& s);

} // namespace ts
