#include "designer/theme.h"

#include <QApplication>
#include <QIconEngine>
#include <QPainter>
#include <QPainterPath>
#include <QPixmap>
#include <QStyle>
#include <QStyleFactory>

#include <optional>

namespace ts {

namespace {

struct GroupStyle {
    const char* group;
    const char* title;
    QRgb color;
    const char* glyph;
};

const GroupStyle kGroups[] = {
    {"core", "Core", 0x3b82f6, "D"},
    {"convolution", "Convolution", 0xf59e0b, "C"},
    {"pooling", "Pooling", 0x14b8a6, "P"},
    {"normalisation", "Normalisation", 0x8b5cf6, "N"},
    {"activation", "Activation", 0x22c55e, "A"},
    {"merge", "Merge", 0xec4899, "M"},
};

const GroupStyle* findGroup(const std::string& group)
{
    for (const GroupStyle& g : kGroups)
        if (group == g.group)
            return &g;
    return nullptr;
}

QColor mix(const QColor& a, const QColor& b, double t)
{
    return QColor::fromRgbF(static_cast<float>(a.redF() * (1 - t) + b.redF() * t),
                            static_cast<float>(a.greenF() * (1 - t) + b.greenF() * t),
                            static_cast<float>(a.blueF() * (1 - t) + b.blueF() * t));
}

// Paints the icon at whatever size and device pixel ratio it is asked for.
class GlyphIconEngine : public QIconEngine {
public:
    GlyphIconEngine(QColor color, QString glyph) : m_color(color), m_glyph(std::move(glyph)) {}
    void paint(QPainter* p, const QRect& rect, QIcon::Mode mode, QIcon::State) override
    {
        p->save();
        p->setRenderHint(QPainter::Antialiasing);
        QColor c = mode == QIcon::Disabled ? QColor(150, 150, 150) : m_color;
        const QRectF r = QRectF(rect).adjusted(1, 1, -1, -1);
        p->setPen(Qt::NoPen);
        p->setBrush(c);
        p->drawRoundedRect(r, r.width() * 0.22, r.height() * 0.22);
        if (!m_glyph.isEmpty()) {
            QFont f = QApplication::font();
            f.setBold(true);
            f.setPixelSize(std::max(6, static_cast<int>(r.height() * 0.62)));
            p->setFont(f);
            p->setPen(Qt::white);
            p->drawText(r, Qt::AlignCenter, m_glyph);
        }
        p->restore();
    }
    QPixmap pixmap(const QSize& size, QIcon::Mode mode, QIcon::State state) override
    {
        return scaledPixmap(size, mode, state, 1.0);
    }
    QPixmap scaledPixmap(const QSize& size, QIcon::Mode mode, QIcon::State state, qreal scale) override
    {
        QPixmap pm(size * scale);
        pm.fill(Qt::transparent);
        {
            QPainter p(&pm);
            paint(&p, QRect(QPoint(0, 0), size * scale), mode, state);
        }
        pm.setDevicePixelRatio(scale);
        return pm;
    }
    QIconEngine* clone() const override { return new GlyphIconEngine(m_color, m_glyph); }

private:
    QColor m_color;
    QString m_glyph;
};

struct SystemLook {
    QPalette palette;
    QString style;
};
std::optional<SystemLook>& systemLook()
{
    static std::optional<SystemLook> look;
    return look;
}

} // namespace

bool isDarkPalette(const QPalette& palette)
{
    return palette.color(QPalette::Window).lightness() < 128;
}

QColor DesignerTheme::groupColor(const std::string& group) const
{
    const GroupStyle* g = findGroup(group);
    QColor c = g ? QColor(g->color) : QColor(0x64748b);
    return dark ? c.darker(115) : c;
}

DesignerTheme DesignerTheme::fromPalette(const QPalette& pal, const QFont& font)
{
    DesignerTheme t;
    t.dark = isDarkPalette(pal);
    const QColor base = pal.color(QPalette::Base);
    const QColor text = pal.color(QPalette::Text);
    const QColor window = pal.color(QPalette::Window);
    t.canvas = t.dark ? mix(base, window, 0.5) : mix(window, QColor(Qt::white), 0.55);
    t.grid = mix(t.canvas, text, t.dark ? 0.22 : 0.18);
    t.nodeFill = t.dark ? mix(window, QColor(Qt::white), 0.06) : QColor(Qt::white);
    t.nodeBorder = mix(t.nodeFill, text, t.dark ? 0.35 : 0.28);
    t.nodeText = text;
    t.nodeSubtext = mix(text, t.nodeFill, 0.42);
    t.selection = pal.color(QPalette::Highlight);
    t.edge = mix(t.canvas, text, t.dark ? 0.55 : 0.5);
    t.edgeLabelFill = t.dark ? mix(window, QColor(Qt::black), 0.25) : QColor(0xeef2f7);
    t.edgeLabelText = mix(text, t.edgeLabelFill, 0.15);
    t.error = t.dark ? QColor(0xf87171) : QColor(0xdc2626);
    t.errorFill = t.dark ? QColor(0x4a1d1d) : QColor(0xfee2e2);
    t.port = mix(t.nodeFill, text, 0.45);
    t.portHover = t.selection;
    t.dragLine = t.selection;
    t.titleFont = font;
    t.titleFont.setBold(true);
    t.bodyFont = font;
    t.smallFont = font;
    if (font.pointSizeF() > 0) {
        t.titleFont.setPointSizeF(font.pointSizeF());
        t.bodyFont.setPointSizeF(font.pointSizeF() * 0.9);
        t.smallFont.setPointSizeF(font.pointSizeF() * 0.82);
    }
    return t;
}

QPalette studioPalette(bool dark)
{
    QPalette p;
    if (!dark) {
        p = QPalette(QColor(0xf3f4f6));
        p.setColor(QPalette::Window, QColor(0xf3f4f6));
        p.setColor(QPalette::Base, Qt::white);
        p.setColor(QPalette::AlternateBase, QColor(0xf8fafc));
        p.setColor(QPalette::Text, QColor(0x111827));
        p.setColor(QPalette::WindowText, QColor(0x111827));
        p.setColor(QPalette::ButtonText, QColor(0x111827));
        p.setColor(QPalette::Button, QColor(0xe5e7eb));
        p.setColor(QPalette::Highlight, QColor(0x2563eb));
        p.setColor(QPalette::HighlightedText, Qt::white);
        p.setColor(QPalette::ToolTipBase, QColor(0xffffe1));
        p.setColor(QPalette::ToolTipText, QColor(0x111827));
        p.setColor(QPalette::PlaceholderText, QColor(0x6b7280));
        p.setColor(QPalette::Link, QColor(0x2563eb));
        return p;
    }
    const QColor window(0x1f2329), base(0x16191d), text(0xe5e7eb), disabled(0x6b7280);
    p = QPalette(window);
    p.setColor(QPalette::Window, window);
    p.setColor(QPalette::WindowText, text);
    p.setColor(QPalette::Base, base);
    p.setColor(QPalette::AlternateBase, QColor(0x23272e));
    p.setColor(QPalette::Text, text);
    p.setColor(QPalette::Button, QColor(0x2b3038));
    p.setColor(QPalette::ButtonText, text);
    p.setColor(QPalette::BrightText, QColor(0xff6b6b));
    p.setColor(QPalette::Highlight, QColor(0x3b82f6));
    p.setColor(QPalette::HighlightedText, Qt::white);
    p.setColor(QPalette::ToolTipBase, QColor(0x2b3038));
    p.setColor(QPalette::ToolTipText, text);
    p.setColor(QPalette::PlaceholderText, disabled);
    p.setColor(QPalette::Link, QColor(0x60a5fa));
    p.setColor(QPalette::Light, QColor(0x3a4049));
    p.setColor(QPalette::Midlight, QColor(0x30353d));
    p.setColor(QPalette::Mid, QColor(0x262a31));
    p.setColor(QPalette::Dark, QColor(0x121417));
    p.setColor(QPalette::Shadow, Qt::black);
    for (QPalette::ColorRole role : {QPalette::WindowText, QPalette::Text, QPalette::ButtonText})
        p.setColor(QPalette::Disabled, role, disabled);
    return p;
}

void applyThemeMode(ThemeMode mode)
{
    auto& look = systemLook();
    if (!look)
        look = SystemLook{QApplication::palette(),
                          QApplication::style() ? QApplication::style()->name() : QString()};
    if (mode == ThemeMode::System) {
        if (!look->style.isEmpty() && QApplication::style()->name() != look->style)
            QApplication::setStyle(QStyleFactory::create(look->style));
        QApplication::setPalette(look->palette);
        return;
    }
    if (QApplication::style()->name().compare(QLatin1String("fusion"), Qt::CaseInsensitive) != 0)
        QApplication::setStyle(QStyleFactory::create(QStringLiteral("Fusion")));
    QApplication::setPalette(studioPalette(mode == ThemeMode::Dark));
}

ThemeMode themeModeFromString(const QString& s)
{
    if (s.compare(QLatin1String("light"), Qt::CaseInsensitive) == 0)
        return ThemeMode::Light;
    if (s.compare(QLatin1String("dark"), Qt::CaseInsensitive) == 0)
        return ThemeMode::Dark;
    return ThemeMode::System;
}

QString themeModeToString(ThemeMode mode)
{
    switch (mode) {
    case ThemeMode::Light: return QStringLiteral("light");
    case ThemeMode::Dark: return QStringLiteral("dark");
    case ThemeMode::System: break;
    }
    return QStringLiteral("system");
}

QIcon groupIcon(const std::string& group)
{
    const GroupStyle* g = findGroup(group);
    return QIcon(new GlyphIconEngine(g ? QColor(g->color) : QColor(0x64748b),
                                     QString::fromLatin1(g ? g->glyph : "?")));
}

QString groupTitle(const std::string& group)
{
    const GroupStyle* g = findGroup(group);
    return g ? QString::fromLatin1(g->title) : QString::fromStdString(group);
}

const std::vector<std::string>& groupOrder()
{
    static const std::vector<std::string> order = [] {
        std::vector<std::string> o;
        for (const GroupStyle& g : kGroups)
            o.emplace_back(g.group);
        return o;
    }();
    return order;
}

QIcon appIcon()
{
    // Three stacked layers joined by edges: the designer in miniature.
    class AppIconEngine : public GlyphIconEngine {
    public:
        AppIconEngine() : GlyphIconEngine(QColor(0x2563eb), QString()) {}
        void paint(QPainter* p, const QRect& rect, QIcon::Mode mode, QIcon::State state) override
        {
            GlyphIconEngine::paint(p, rect, mode, state);
            p->save();
            p->setRenderHint(QPainter::Antialiasing);
            const QRectF r(rect);
            const double w = r.width(), h = r.height();
            p->setPen(QPen(QColor(255, 255, 255, 200), std::max(1.0, w * 0.04)));
            p->drawLine(QPointF(r.left() + w * 0.5, r.top() + h * 0.3), QPointF(r.left() + w * 0.5, r.top() + h * 0.7));
            p->setPen(Qt::NoPen);
            p->setBrush(Qt::white);
            for (int i = 0; i < 3; ++i)
                p->drawRoundedRect(QRectF(r.left() + w * 0.22, r.top() + h * (0.16 + i * 0.26), w * 0.56, h * 0.16), w * 0.04, w * 0.04);
            p->restore();
        }
        QIconEngine* clone() const override { return new AppIconEngine; }
    };
    return QIcon(new AppIconEngine);
}

} // namespace ts
