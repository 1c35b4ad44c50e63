#pragma once
// The layer palette: a search field over the catalogue tree. Drag a layer onto the canvas, or
// double-click it / press Enter in the search field to add it below the selected layer.

#include <QModelIndex>
#include <QWidget>

class QLineEdit;
class QTreeView;

namespace ts {

class LayerPaletteModel;
class LayerPaletteFilter;

class PaletteWidget : public QWidget {
    Q_OBJECT
public:
    explicit PaletteWidget(QWidget* parent = nullptr);

    QLineEdit* searchField() const { return m_search; }
    QTreeView* view() const { return m_view; }
    LayerPaletteModel* model() const { return m_model; }
    LayerPaletteFilter* filter() const { return m_filter; }
    // The rectangle of a layer type's row in view()->viewport() coordinates (empty if hidden).
    QRect rectOfType(const QString& type) const;
    // The (filtered) view's index of a layer type, or invalid if it is filtered out.
    QModelIndex indexOfType(const QString& type) const;

Q_SIGNALS:
    void layerActivated(const QString& type);

protected:
    bool eventFilter(QObject* watched, QEvent* event) override;

private:
    QLineEdit* m_search;
    QTreeView* m_view;
    LayerPaletteModel* m_model;
    LayerPaletteFilter* m_filter;
};

} // namespace ts
