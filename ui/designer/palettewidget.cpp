#include "designer/palettewidget.h"

#include <QApplication>
#include <QKeyEvent>
#include <QLineEdit>
#include <QPainter>
#include <QStyledItemDelegate>
#include <QTreeView>
#include <QVBoxLayout>

#include "models/layerpalettemodel.h"

namespace ts {

namespace {

// Layer rows: icon, type in bold and the one-line description below it, elided to the width
// (the full text is the tooltip).
class PaletteDelegate : public QStyledItemDelegate {
public:
    using QStyledItemDelegate::QStyledItemDelegate;

    void paint(QPainter* p, const QStyleOptionViewItem& option, const QModelIndex& index) const override
    {
        if (index.data(LayerPaletteModel::IsGroupRole).toBool()) {
            QStyleOptionViewItem o = option;
            initStyleOption(&o, index);
            o.font.setBold(true);
            QStyledItemDelegate::paint(p, o, index);
            return;
        }
        QStyleOptionViewItem o = option;
        initStyleOption(&o, index);
        o.text.clear();
        o.icon = QIcon();
        const QWidget* w = option.widget;
        QStyle* style = w ? w->style() : QApplication::style();
        style->drawControl(QStyle::CE_ItemViewItem, &o, p, w);

        const QRect r = option.rect.adjusted(4, 3, -4, -3);
        const int iconSize = 22;
        const QIcon icon = index.data(Qt::DecorationRole).value<QIcon>();
        icon.paint(p, QRect(r.left(), r.top() + (r.height() - iconSize) / 2, iconSize, iconSize));
        const bool selected = option.state & QStyle::State_Selected;
        const QPalette& pal = option.palette;
        const QColor text = selected ? pal.color(QPalette::HighlightedText) : pal.color(QPalette::Text);
        QColor sub = text;
        sub.setAlphaF(0.65f);
        const QRect textRect = r.adjusted(iconSize + 8, 0, 0, 0);
        QFont bold = option.font;
        bold.setBold(true);
        const QFontMetrics boldFm(bold), fm(option.font);
        p->save();
        p->setFont(bold);
        p->setPen(text);
        p->drawText(QRect(textRect.left(), textRect.top(), textRect.width(), boldFm.height()),
                    Qt::AlignLeft | Qt::AlignVCenter, index.data(Qt::DisplayRole).toString());
        QFont small = option.font;
        small.setPointSizeF(option.font.pointSizeF() * 0.9);
        const QFontMetrics smallFm(small);
        p->setFont(small);
        p->setPen(sub);
        p->drawText(QRect(textRect.left(), textRect.top() + boldFm.height(), textRect.width(), smallFm.height()),
                    Qt::AlignLeft | Qt::AlignVCenter,
                    smallFm.elidedText(index.data(LayerPaletteModel::DescriptionRole).toString(),
                                       Qt::ElideRight, textRect.width()));
        p->restore();
    }

    QSize sizeHint(const QStyleOptionViewItem& option, const QModelIndex& index) const override
    {
        QSize s = QStyledItemDelegate::sizeHint(option, index);
        if (index.data(LayerPaletteModel::IsGroupRole).toBool())
            return s;
        QFont small = option.font;
        small.setPointSizeF(option.font.pointSizeF() * 0.9);
        return QSize(s.width(), QFontMetrics(option.font).height() + QFontMetrics(small).height() + 8);
    }
};

} // namespace

PaletteWidget::PaletteWidget(QWidget* parent)
    : QWidget(parent), m_search(new QLineEdit(this)), m_view(new QTreeView(this)),
      m_model(new LayerPaletteModel(this)), m_filter(new LayerPaletteFilter(this))
{
    m_search->setObjectName(QStringLiteral("paletteSearch"));
    m_search->setPlaceholderText(tr("Search layers"));
    m_search->setClearButtonEnabled(true);
    m_search->setToolTip(tr("Type to filter the layers by name or description; Enter adds the "
                            "first match below the selected layer"));
    m_search->installEventFilter(this);

    m_filter->setSourceModel(m_model);
    m_view->setObjectName(QStringLiteral("paletteView"));
    m_view->setModel(m_filter);
    m_view->setHeaderHidden(true);
    m_view->setItemDelegate(new PaletteDelegate(m_view));
    m_view->setDragEnabled(true);
    m_view->setDragDropMode(QAbstractItemView::DragOnly);
    m_view->setDefaultDropAction(Qt::CopyAction);
    m_view->setSelectionMode(QAbstractItemView::SingleSelection);
    m_view->setIndentation(10);
    m_view->setUniformRowHeights(false);
    m_view->setAnimated(false);
    m_view->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_view->expandAll();

    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);
    layout->setSpacing(4);
    layout->addWidget(m_search);
    layout->addWidget(m_view);

    connect(m_search, &QLineEdit::textChanged, this, [this](const QString& text) {
        m_filter->setQuery(text);
        m_view->expandAll();
        const QModelIndex first = m_filter->firstMatch();
        if (!text.isEmpty() && first.isValid())
            m_view->setCurrentIndex(first);
    });
    connect(m_search, &QLineEdit::returnPressed, this, [this] {
        QModelIndex i = m_view->currentIndex();
        if (!i.isValid() || i.data(LayerPaletteModel::IsGroupRole).toBool())
            i = m_filter->firstMatch();
        if (i.isValid())
            Q_EMIT layerActivated(i.data(LayerPaletteModel::TypeRole).toString());
    });
    connect(m_view, &QTreeView::activated, this, [this](const QModelIndex& i) {
        if (!i.data(LayerPaletteModel::IsGroupRole).toBool())
            Q_EMIT layerActivated(i.data(LayerPaletteModel::TypeRole).toString());
    });
}

QModelIndex PaletteWidget::indexOfType(const QString& type) const
{
    return m_filter->mapFromSource(m_model->indexOfType(type));
}

QRect PaletteWidget::rectOfType(const QString& type) const
{
    const QModelIndex i = indexOfType(type);
    return i.isValid() ? m_view->visualRect(i) : QRect();
}

bool PaletteWidget::eventFilter(QObject* watched, QEvent* event)
{
    // Up/Down in the search field walk the matches without leaving the field.
    if (watched == m_search && event->type() == QEvent::KeyPress) {
        auto* key = static_cast<QKeyEvent*>(event);
        if (key->key() == Qt::Key_Down || key->key() == Qt::Key_Up) {
            QModelIndex i = m_view->currentIndex();
            do {
                i = key->key() == Qt::Key_Down ? m_view->indexBelow(i.isValid() ? i : m_filter->index(0, 0))
                                               : m_view->indexAbove(i);
            } while (i.isValid() && i.data(LayerPaletteModel::IsGroupRole).toBool());
            if (i.isValid())
                m_view->setCurrentIndex(i);
            return true;
        }
    }
    return QWidget::eventFilter(watched, event);
}

} // namespace ts
