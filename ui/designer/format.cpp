#include "designer/format.h"

#include <cmath>
#include <cstdlib>

namespace ts {

QString shapeText(const Shape& shape)
{
    if (shape.rank() == 0)
        return QStringLiteral("?");
    QString s;
    for (int i = 0; i < shape.rank(); ++i) {
        if (i > 0)
            s += QChar(0x00D7);  // ×
        s += QString::number(shape[i]);
    }
    return s;
}

QString compactCount(int64_t n)
{
    const double v = static_cast<double>(std::llabs(n));
    const QString sign = n < 0 ? QStringLiteral("-") : QString();
    struct Unit { double scale; const char* suffix; };
    static const Unit units[] = {{1e9, "G"}, {1e6, "M"}, {1e3, "K"}};
    for (const Unit& u : units) {
        if (v >= u.scale) {
            const double x = v / u.scale;
            // One decimal below 10 ("1.2K", but "2K" not "2.0K"), whole numbers above ("201K").
            const double r = x < 10 ? std::round(x * 10) / 10 : std::round(x);
            const bool whole = r == std::floor(r);
            const QString num = QString::number(r, 'f', whole ? 0 : 1);
            return sign + num + QLatin1String(u.suffix);
        }
    }
    return sign + QString::number(static_cast<qint64>(v));
}

QString exactCount(int64_t n)
{
    QString digits = QString::number(static_cast<qint64>(std::llabs(n)));
    for (int i = digits.size() - 3; i > 0; i -= 3)
        digits.insert(i, QLatin1Char(','));
    return n < 0 ? QStringLiteral("-") + digits : digits;
}

QString problemTextForNode(const std::string& message, const std::string& nodeId)
{
    const std::string prefix = "node '" + nodeId + "': ";
    if (message.rfind(prefix, 0) == 0)
        return toQString(message.substr(prefix.size()));
    return toQString(message);
}

QString counted(int64_t n, const char* singular, const char* plural)
{
    return QString::number(static_cast<qint64>(n)) + QLatin1Char(' ')
           + QLatin1String(n == 1 ? singular : plural);
}

QString toQString(const std::string& s)
{
    return QString::fromStdString(s);
}

std::string toStdString(const QString& s)
{
    return s.toStdString();
}

} // namespace ts
