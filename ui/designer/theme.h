#pragma once
// Colours and fonts of the designer, derived from the application palette so the canvas follows
// the system's light or dark appearance; plus the studio's own light and dark palettes for when
// the user picks one explicitly (View ▸ Theme).

#include <QColor>
#include <QFont>
#include <QIcon>
#include <QPalette>

#include <string>
#include <vector>

namespace ts {

enum class ThemeMode { System, Light, Dark };

struct DesignerTheme {
    bool dark = false;
    QColor canvas, grid, nodeFill, nodeBorder, nodeText, nodeSubtext, selection, edge, edgeLabelFill,
        edgeLabelText, error, errorFill, port, portHover, dragLine;
    QFont titleFont, bodyFont, smallFont;

    // The accent colour of a catalogue group ("core", "convolution", ...).
    QColor groupColor(const std::string& group) const;
    static DesignerTheme fromPalette(const QPalette& palette, const QFont& font);
};

bool isDarkPalette(const QPalette& palette);
QPalette studioPalette(bool dark);
// Applies a theme to the application: System restores the palette and style the platform gave
// (captured on first call); Light and Dark use Fusion with the studio palettes.
void applyThemeMode(ThemeMode mode);
ThemeMode themeModeFromString(const QString& s);  // "system", "light", "dark"
QString themeModeToString(ThemeMode mode);

// The palette icon of a catalogue group: a rounded square in the group colour with a glyph,
// drawn at every device pixel ratio (sharp on high-DPI screens).
QIcon groupIcon(const std::string& group);
QString groupTitle(const std::string& group);  // "Core", "Convolution", ...
// The catalogue groups in palette order.
const std::vector<std::string>& groupOrder();
QIcon appIcon();

} // namespace ts
