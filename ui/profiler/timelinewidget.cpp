#include "profiler/timelinewidget.h"

#include <QHelpEvent>
#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>

#include <algorithm>
#include <cmath>

#include "designer/theme.h"

namespace ts {

namespace {

constexpr int kRulerHeight = 24;
constexpr int kLaneTitleHeight = 18;
constexpr int kRowHeight = 16;
constexpr int kRowGap = 1;
constexpr int kLaneGap = 4;
// Below this width a span is merged with its pixel column's neighbours instead of drawn alone.
constexpr double kMinSpanPx = 2.0;
constexpr double kMinVisibleUs = 1.0;  // spans have microsecond resolution
constexpr int kDragThreshold = 3;

double niceStep(double raw)
{
    const double mag = std::pow(10.0, std::floor(std::log10(std::max(raw, 1e-9))));
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if (m * mag >= raw)
            return m * mag;
    return 10 * mag;
}

// The first index in [from, end) whose start is >= t. Galloping from `from` rather than bisecting
// the whole row: the answer is usually a few spans ahead, and this stays in the cache lines
// already touched (a full bisection of a 100k-span row misses the cache at every step).
std::size_t firstStartAtOrAfter(const std::vector<int64_t>& starts, std::size_t from, std::size_t end, double t)
{
    std::size_t lo = from, hi = from, step = 1;
    while (hi < end && static_cast<double>(starts[hi]) < t) {
        lo = hi + 1;
        hi = from + step;
        step *= 2;
    }
    hi = std::min(hi, end);
    return static_cast<std::size_t>(
        std::lower_bound(starts.begin() + static_cast<std::ptrdiff_t>(lo), starts.begin() + static_cast<std::ptrdiff_t>(hi), t,
                         [](int64_t start, double v) { return static_cast<double>(start) < v; }) -
        starts.begin());
}

QColor textOn(const QColor& fill)
{
    return qGray(fill.rgb()) > 150 ? QColor(0x1f2937) : QColor(Qt::white);
}

} // namespace

QColor timelineCategoryColor(const std::string& category)
{
    struct Known {
        const char* name;
        QRgb color;
    };
    // The step parts share the dashboard's colours; the rest are what TrainStudio records.
    static const Known kKnown[] = {
        {"input", 0xf59e0b},    {"forward", 0x3b82f6},   {"backward", 0x8b5cf6}, {"communication", 0xec4899},
        {"optimizer", 0x22c55e}, {"other", 0x94a3b8},     {"step", 0x64748b},     {"checkpoint", 0x14b8a6},
        {"eval", 0x0ea5e9},     {"uncategorised", 0xa8a29e},
    };
    for (const Known& k : kKnown)
        if (category == k.name)
            return QColor(k.color);
    // FNV-1a: the same category gets the same hue in every session.
    uint32_t h = 2166136261u;
    for (unsigned char c : category)
        h = (h ^ c) * 16777619u;
    return QColor::fromHsv(static_cast<int>(h % 360), 150 + static_cast<int>((h >> 9) % 60), 200 + static_cast<int>((h >> 17) % 40));
}

QString formatMicros(double us)
{
    const double a = std::fabs(us);
    if (a < 1000)
        return QStringLiteral("%1 us").arg(us, 0, 'g', 4);
    if (a < 1e6)
        return QStringLiteral("%1 ms").arg(us / 1e3, 0, 'g', 4);
    return QStringLiteral("%1 s").arg(us / 1e6, 0, 'g', 4);
}

TimelineWidget::TimelineWidget(QWidget* parent) : QWidget(parent)
{
    setObjectName(QStringLiteral("timeline"));
    setFocusPolicy(Qt::StrongFocus);
    setAttribute(Qt::WA_OpaquePaintEvent);
    setToolTip(tr("Wheel or +/- zooms, drag or arrow keys pan, click selects a span, Shift+drag selects a range"));
}

void TimelineWidget::setData(std::shared_ptr<const TimelineData> data)
{
    m_data = std::move(data);
    m_selected = -1;
    m_rangeValid = false;
    m_highlighted.clear();
    m_scrollY = 0;
    m_colors.clear();
    if (m_data)
        for (const std::string& c : m_data->categories())
            m_colors.push_back(timelineCategoryColor(c));
    layoutRows();
    zoomToFit();
}

void TimelineWidget::clear()
{
    setData(nullptr);
}

void TimelineWidget::layoutRows()
{
    m_rowY.clear();
    if (!m_data)
        return;
    m_rowY.resize(m_data->rows().size());
    int y = 0;
    for (const TimelineLane& lane : m_data->lanes()) {
        y += kLaneTitleHeight;
        for (int d = 0; d < lane.depthCount; ++d) {
            m_rowY[static_cast<std::size_t>(lane.firstRow + d)] = y;
            y += kRowHeight + kRowGap;
        }
        y += kLaneGap;
    }
}

int TimelineWidget::rowY(int row) const
{
    return m_rowY[static_cast<std::size_t>(row)];
}

int TimelineWidget::contentHeight() const
{
    if (m_rowY.empty())
        return 0;
    return m_rowY.back() + kRowHeight + kRowGap + kLaneGap;
}

int TimelineWidget::rowAtY(int y) const
{
    if (m_rowY.empty() || y < kRulerHeight)
        return -1;
    const int cy = y - kRulerHeight + m_scrollY;
    const auto it = std::upper_bound(m_rowY.begin(), m_rowY.end(), cy);
    if (it == m_rowY.begin())
        return -1;
    const int row = static_cast<int>(it - m_rowY.begin()) - 1;
    return cy < rowY(row) + kRowHeight ? row : -1;
}

double TimelineWidget::plotWidth() const
{
    return std::max(1, width());
}

double TimelineWidget::xOfTime(double timeUs) const
{
    return plotLeft() + (timeUs - m_t0) * plotWidth() / (m_t1 - m_t0);
}

double TimelineWidget::timeOfX(double x) const
{
    return m_t0 + (x - plotLeft()) * (m_t1 - m_t0) / plotWidth();
}

void TimelineWidget::setVisibleRange(double t0Us, double t1Us)
{
    if (!(t1Us > t0Us))
        std::swap(t0Us, t1Us);
    m_t0 = t0Us;
    m_t1 = std::max(t1Us, t0Us + kMinVisibleUs);
    clampView();
    update();
    Q_EMIT visibleRangeChanged(m_t0, m_t1);
}

void TimelineWidget::zoomBy(double factor, double anchorFraction)
{
    if (!(factor > 0))
        return;
    const double span = m_t1 - m_t0;
    const double fraction = std::clamp(anchorFraction, 0.0, 1.0);
    const double anchor = m_t0 + fraction * span;
    const double newSpan = std::max(kMinVisibleUs, span / factor);
    setVisibleRange(anchor - fraction * newSpan, anchor - fraction * newSpan + newSpan);
}

void TimelineWidget::panByPixels(double dx)
{
    const double dt = dx * (m_t1 - m_t0) / plotWidth();
    setVisibleRange(m_t0 - dt, m_t1 - dt);
}

void TimelineWidget::zoomToFit()
{
    if (!m_data || m_data->empty()) {
        m_t0 = 0;
        m_t1 = 1;
        update();
        return;
    }
    const double total = std::max<double>(kMinVisibleUs, static_cast<double>(m_data->endUs() - m_data->startUs()));
    setVisibleRange(static_cast<double>(m_data->startUs()) - total * 0.01, static_cast<double>(m_data->endUs()) + total * 0.01);
}

void TimelineWidget::clampView()
{
    if (!m_data || m_data->empty())
        return;
    // Never further out than the whole trace with a margin, never panned off it entirely.
    const double start = static_cast<double>(m_data->startUs()), end = static_cast<double>(m_data->endUs());
    const double total = std::max(kMinVisibleUs, end - start);
    const double margin = total * 0.05;
    double span = std::min(m_t1 - m_t0, total + 2 * margin);
    m_t0 = std::clamp(m_t0, start - margin, std::max(start - margin, end + margin - span));
    m_t1 = m_t0 + span;
}

void TimelineWidget::setScroll(int y)
{
    const int maxScroll = std::max(0, contentHeight() - (height() - kRulerHeight));
    const int clamped = std::clamp(y, 0, maxScroll);
    if (clamped != m_scrollY) {
        m_scrollY = clamped;
        update();
    }
}

void TimelineWidget::selectSpan(int span)
{
    if (!m_data || span < 0 || static_cast<std::size_t>(span) >= m_data->spans().size())
        span = -1;
    m_selected = span;
    if (span >= 0) {
        // Scroll the span's row into view.
        const int row = m_data->rowOf(span);
        if (row >= 0) {
            const int top = rowY(row), visible = height() - kRulerHeight;
            if (top < m_scrollY)
                setScroll(top - kLaneTitleHeight);
            else if (top + kRowHeight > m_scrollY + visible)
                setScroll(top + kRowHeight - visible);
        }
    }
    update();
    Q_EMIT spanSelected(span);
}

void TimelineWidget::setSelectedRange(int64_t t0Us, int64_t t1Us)
{
    if (t1Us < t0Us)
        std::swap(t0Us, t1Us);
    m_rangeValid = true;
    m_rangeT0 = t0Us;
    m_rangeT1 = t1Us;
    update();
    Q_EMIT rangeSelected(t0Us, t1Us);
}

void TimelineWidget::clearSelectedRange()
{
    m_rangeValid = false;
    update();
}

void TimelineWidget::setHighlightedSpans(std::vector<int> spans)
{
    std::sort(spans.begin(), spans.end());
    spans.erase(std::unique(spans.begin(), spans.end()), spans.end());
    m_highlighted = std::move(spans);
    update();
}

int TimelineWidget::spanAt(QPoint pos) const
{
    if (!m_data)
        return -1;
    const int row = rowAtY(pos.y());
    if (row < 0)
        return -1;
    const int hit = m_data->spanAt(row, timeOfX(pos.x()));
    if (hit >= 0)
        return hit;
    // Spans narrower than a pixel: take the nearest within a few pixels.
    const double slack = kDragThreshold * (m_t1 - m_t0) / plotWidth();
    const auto [first, last] = m_data->rowRange(row, timeOfX(pos.x()) - slack, timeOfX(pos.x()) + slack);
    if (first >= last)
        return -1;
    const TimelineRow& r = m_data->rows()[static_cast<std::size_t>(row)];
    const double t = timeOfX(pos.x());
    std::size_t best = first;
    double bestDist = 1e300;
    for (std::size_t k = first; k < last && k < first + 64; ++k) {
        const double d = std::min(std::fabs(static_cast<double>(r.starts[k]) - t), std::fabs(static_cast<double>(r.ends[k]) - t));
        if (d < bestDist) {
            bestDist = d;
            best = k;
        }
    }
    return r.spans[best];
}

QRectF TimelineWidget::spanRect(int span) const
{
    if (!m_data || span < 0 || static_cast<std::size_t>(span) >= m_data->spans().size())
        return {};
    const int row = m_data->rowOf(span);
    if (row < 0)
        return {};
    const int y = kRulerHeight + rowY(row) - m_scrollY;
    if (y + kRowHeight <= kRulerHeight || y >= height())
        return {};
    const telemetry::SpanEvent& s = m_data->spans()[static_cast<std::size_t>(span)];
    const double x0 = xOfTime(static_cast<double>(s.startUs));
    const double x1 = xOfTime(static_cast<double>(s.startUs + s.durationUs));
    return QRectF(x0, y, std::max(1.0, x1 - x0), kRowHeight);
}

void TimelineWidget::paintEvent(QPaintEvent*)
{
    QElapsedTimer timer;
    timer.start();
    QPainter p(this);
    const DesignerTheme theme = DesignerTheme::fromPalette(palette(), font());
    p.fillRect(rect(), theme.canvas);
    if (!m_data || m_data->empty()) {
        p.setPen(theme.nodeSubtext);
        p.setFont(theme.bodyFont);
        p.drawText(rect(), Qt::AlignCenter,
                   tr("No trace: open a Chrome trace file or a run with recorded spans."));
        m_lastFrameMs = static_cast<double>(timer.nsecsElapsed()) / 1e6;
        return;
    }

    // Grid lines under everything, at the ruler's ticks.
    const double step = niceStep(90.0 * (m_t1 - m_t0) / plotWidth());
    const double origin = static_cast<double>(m_data->startUs());
    const double firstTick = origin + std::ceil((m_t0 - origin) / step) * step;
    QColor grid = theme.grid;
    grid.setAlpha(90);
    p.setPen(grid);
    for (double t = firstTick; t <= m_t1; t += step) {
        const double x = std::round(xOfTime(t)) + 0.5;
        p.drawLine(QPointF(x, kRulerHeight), QPointF(x, height()));
    }

    p.setClipRect(QRect(0, kRulerHeight, width(), height() - kRulerHeight));
    const int visibleTop = m_scrollY, visibleBottom = m_scrollY + height() - kRulerHeight;
    // Lane titles.
    QColor band = theme.nodeFill;
    band.setAlpha(200);
    p.setFont(theme.smallFont);
    for (const TimelineLane& lane : m_data->lanes()) {
        const int top = rowY(lane.firstRow) - kLaneTitleHeight;
        if (top + kLaneTitleHeight < visibleTop || top > visibleBottom)
            continue;
        const QRect r(0, kRulerHeight + top - m_scrollY, width(), kLaneTitleHeight);
        p.fillRect(r, band);
        p.setPen(theme.nodeText);
        p.drawText(r.adjusted(6, 0, -6, 0), Qt::AlignLeft | Qt::AlignVCenter,
                   tr("%1  (%n row(s))", nullptr, lane.depthCount).arg(QString::fromStdString(lane.label)));
    }
    // Rows: only those on screen.
    const auto firstRow = std::upper_bound(m_rowY.begin(), m_rowY.end(), visibleTop - kRowHeight);
    for (auto it = firstRow; it != m_rowY.end() && *it <= visibleBottom; ++it) {
        const int row = static_cast<int>(it - m_rowY.begin());
        paintRow(p, row, kRulerHeight + *it - m_scrollY);
    }
    // Highlighted spans (a finding's) and the selected one, outlined over the rows.
    p.setBrush(Qt::NoBrush);
    p.setPen(QPen(QColor(0xf97316), 2));
    for (int span : m_highlighted) {
        const QRectF r = spanRect(span);
        if (!r.isEmpty() && r.right() >= 0 && r.left() <= width())
            p.drawRect(r.adjusted(-1, -1, 1, 1));
    }
    if (m_selected >= 0) {
        const QRectF r = spanRect(m_selected);
        if (!r.isEmpty()) {
            p.setPen(QPen(theme.selection, 2));
            p.drawRect(r.adjusted(-1.5, -1.5, 1.5, 1.5));
        }
    }
    if (m_rangeValid || m_drag == Drag::Range) {
        const double x0 = xOfTime(static_cast<double>(m_rangeT0)), x1 = xOfTime(static_cast<double>(m_rangeT1));
        QColor fill = theme.selection;
        fill.setAlpha(45);
        const QRectF r(std::min(x0, x1), kRulerHeight, std::fabs(x1 - x0), height() - kRulerHeight);
        p.fillRect(r, fill);
        p.setPen(QPen(theme.selection, 1));
        p.drawLine(r.topLeft(), r.bottomLeft());
        p.drawLine(r.topRight(), r.bottomRight());
    }
    p.setClipping(false);
    paintRuler(p);
    m_lastFrameMs = static_cast<double>(timer.nsecsElapsed()) / 1e6;
}

void TimelineWidget::paintRuler(QPainter& p)
{
    const DesignerTheme theme = DesignerTheme::fromPalette(palette(), font());
    p.fillRect(QRect(0, 0, width(), kRulerHeight), theme.nodeFill);
    p.setPen(theme.nodeBorder);
    p.drawLine(0, kRulerHeight - 1, width(), kRulerHeight - 1);
    const double step = niceStep(90.0 * (m_t1 - m_t0) / plotWidth());
    const double origin = static_cast<double>(m_data->startUs());
    const double firstTick = origin + std::ceil((m_t0 - origin) / step) * step;
    p.setFont(theme.smallFont);
    for (double t = firstTick; t <= m_t1; t += step) {
        const double x = std::round(xOfTime(t)) + 0.5;
        p.setPen(theme.nodeBorder);
        p.drawLine(QPointF(x, kRulerHeight - 6), QPointF(x, kRulerHeight - 1));
        p.setPen(theme.nodeSubtext);
        p.drawText(QRectF(x + 3, 0, 120, kRulerHeight - 4), Qt::AlignLeft | Qt::AlignVCenter, formatMicros(t - origin));
    }
    if (m_rangeValid || m_drag == Drag::Range) {
        const double x0 = xOfTime(static_cast<double>(std::min(m_rangeT0, m_rangeT1)));
        const double x1 = xOfTime(static_cast<double>(std::max(m_rangeT0, m_rangeT1)));
        const QString label = formatMicros(static_cast<double>(std::llabs(m_rangeT1 - m_rangeT0)));
        const QRectF r(x0, 2, std::max(x1 - x0, 60.0), kRulerHeight - 4);
        QColor fill = theme.selection;
        fill.setAlpha(200);
        p.fillRect(r, fill);
        p.setPen(textOn(fill));
        p.drawText(r, Qt::AlignCenter, label);
    }
}

void TimelineWidget::paintRow(QPainter& p, int row, int y)
{
    const TimelineRow& r = m_data->rows()[static_cast<std::size_t>(row)];
    auto [i, last] = m_data->rowRange(row, m_t0, m_t1);
    const double pxPerUs = plotWidth() / (m_t1 - m_t0);
    const double w = width();
    const QFontMetrics fm(p.font());
    const int minLabelWidth = fm.averageCharWidth() * 4;

    // Merged blocks of sub-pixel spans, run-length joined while the colour stays the same.
    double blockX0 = 0, blockX1 = -1;
    int blockColor = -1;
    // Whole-pixel rectangles: the raster engine fills those without coverage computation.
    auto flush = [&] {
        if (blockColor >= 0) {
            const int x0 = static_cast<int>(blockX0), x1 = std::max(x0 + 1, static_cast<int>(std::lround(blockX1)));
            p.fillRect(QRect(x0, y, x1 - x0, kRowHeight), m_colors[static_cast<std::size_t>(blockColor)]);
        }
        blockColor = -1;
    };
    while (i < last) {
        const double x0 = (static_cast<double>(r.starts[i]) - m_t0) * pxPerUs;
        const double x1 = (static_cast<double>(r.ends[i]) - m_t0) * pxPerUs;
        const int span = r.spans[i];
        if (x1 - x0 >= kMinSpanPx) {
            flush();
            const int left = static_cast<int>(std::lround(std::max(x0, -1.0)));
            const int right = static_cast<int>(std::lround(std::min(x1, w + 1)));
            const QColor& fill = m_colors[static_cast<std::size_t>(m_data->categoryIdOf(span))];
            // A one-pixel gap on the right keeps back-to-back spans apart.
            const QRect rect(left, y, std::max(1, right - left - (x1 - x0 > 4 ? 1 : 0)), kRowHeight);
            p.fillRect(rect, fill);
            if (rect.width() > minLabelWidth) {
                const QString name = QString::fromStdString(m_data->spans()[static_cast<std::size_t>(span)].name);
                p.setPen(textOn(fill));
                p.drawText(rect.adjusted(3, 0, -2, 0), Qt::AlignLeft | Qt::AlignVCenter,
                           fm.elidedText(name, Qt::ElideRight, static_cast<int>(rect.width()) - 5));
            }
            ++i;
            continue;
        }
        // Everything that starts inside this pixel column becomes one block.
        const double px = std::floor(x0);
        const double boundary = m_t0 + (px + 1) / pxPerUs;
        std::size_t j = firstStartAtOrAfter(r.starts, i + 1, last, boundary);
        // A wide span that starts in this column is drawn on its own (with its label).
        if (j - 1 > i && static_cast<double>(r.ends[j - 1] - r.starts[j - 1]) * pxPerUs >= kMinSpanPx)
            --j;
        const double right = std::max(px + 1, (static_cast<double>(r.ends[j - 1]) - m_t0) * pxPerUs);
        const int color = m_data->categoryIdOf(span);
        if (blockColor == color && px <= blockX1 + 0.01) {
            blockX1 = std::max(blockX1, right);
        } else {
            flush();
            blockX0 = px;
            blockX1 = right;
            blockColor = color;
        }
        i = j;
    }
    flush();
}

void TimelineWidget::wheelEvent(QWheelEvent* event)
{
    const QPoint delta = event->angleDelta();
    if (delta.y() != 0)
        zoomBy(std::pow(1.2, delta.y() / 120.0), event->position().x() / plotWidth());
    if (delta.x() != 0)
        panByPixels(delta.x() / 3.0);
    event->accept();
}

void TimelineWidget::mousePressEvent(QMouseEvent* event)
{
    if (event->button() != Qt::LeftButton) {
        QWidget::mousePressEvent(event);
        return;
    }
    m_pressPos = event->position().toPoint();
    m_pressT0 = m_t0;
    m_pressT1 = m_t1;
    m_pressScroll = m_scrollY;
    if (event->modifiers() & Qt::ShiftModifier) {
        m_drag = Drag::Range;
        m_rangeValid = false;
        m_rangeT0 = m_rangeT1 = static_cast<int64_t>(std::llround(timeOfX(m_pressPos.x())));
    } else {
        m_drag = Drag::Pending;
    }
    event->accept();
}

void TimelineWidget::mouseMoveEvent(QMouseEvent* event)
{
    const QPoint pos = event->position().toPoint();
    if (m_drag == Drag::Pending && (pos - m_pressPos).manhattanLength() > kDragThreshold)
        m_drag = Drag::Pan;
    if (m_drag == Drag::Pan) {
        const double dt = (pos.x() - m_pressPos.x()) * (m_pressT1 - m_pressT0) / plotWidth();
        setVisibleRange(m_pressT0 - dt, m_pressT1 - dt);
        setScroll(m_pressScroll - (pos.y() - m_pressPos.y()));
    } else if (m_drag == Drag::Range) {
        m_rangeT1 = static_cast<int64_t>(std::llround(timeOfX(pos.x())));
        update();
    }
    event->accept();
}

void TimelineWidget::mouseReleaseEvent(QMouseEvent* event)
{
    if (event->button() != Qt::LeftButton) {
        QWidget::mouseReleaseEvent(event);
        return;
    }
    const QPoint pos = event->position().toPoint();
    const Drag drag = m_drag;
    m_drag = Drag::None;
    if (drag == Drag::Range) {
        if (std::abs(pos.x() - m_pressPos.x()) <= kDragThreshold) {
            clearSelectedRange();
        } else {
            setSelectedRange(m_rangeT0, static_cast<int64_t>(std::llround(timeOfX(pos.x()))));
        }
    } else if (drag == Drag::Pending) {
        selectSpan(spanAt(pos));
    }
    event->accept();
}

void TimelineWidget::mouseDoubleClickEvent(QMouseEvent* event)
{
    // Double-click zooms to the span under the cursor.
    const int span = spanAt(event->position().toPoint());
    if (span < 0)
        return;
    const telemetry::SpanEvent& s = m_data->spans()[static_cast<std::size_t>(span)];
    const double margin = std::max(1.0, static_cast<double>(s.durationUs) * 0.1);
    setVisibleRange(static_cast<double>(s.startUs) - margin, static_cast<double>(s.startUs + s.durationUs) + margin);
    selectSpan(span);
}

void TimelineWidget::keyPressEvent(QKeyEvent* event)
{
    switch (event->key()) {
    case Qt::Key_Plus:
    case Qt::Key_Equal:
        zoomBy(1.25);
        break;
    case Qt::Key_Minus:
        zoomBy(0.8);
        break;
    case Qt::Key_Left:
        panByPixels(plotWidth() * 0.1);
        break;
    case Qt::Key_Right:
        panByPixels(-plotWidth() * 0.1);
        break;
    case Qt::Key_Up:
        setScroll(m_scrollY - 3 * kRowHeight);
        break;
    case Qt::Key_Down:
        setScroll(m_scrollY + 3 * kRowHeight);
        break;
    case Qt::Key_0:
    case Qt::Key_Home:
        zoomToFit();
        break;
    case Qt::Key_Escape:
        clearSelectedRange();
        selectSpan(-1);
        break;
    default:
        QWidget::keyPressEvent(event);
        return;
    }
    event->accept();
}

void TimelineWidget::resizeEvent(QResizeEvent* event)
{
    QWidget::resizeEvent(event);
    setScroll(m_scrollY);
}

void TimelineWidget::changeEvent(QEvent* event)
{
    QWidget::changeEvent(event);
    if (event->type() == QEvent::PaletteChange || event->type() == QEvent::FontChange)
        update();
}

bool TimelineWidget::event(QEvent* event)
{
    if (event->type() == QEvent::ToolTip && m_data) {
        auto* help = static_cast<QHelpEvent*>(event);
        const int span = spanAt(help->pos());
        if (span >= 0) {
            const telemetry::SpanEvent& s = m_data->spans()[static_cast<std::size_t>(span)];
            QToolTip::showText(help->globalPos(),
                               QStringLiteral("<b>%1</b><br>%2 · %3")
                                   .arg(QString::fromStdString(s.name).toHtmlEscaped(),
                                        QString::fromStdString(m_data->categoryOf(span)).toHtmlEscaped(),
                                        formatMicros(static_cast<double>(s.durationUs))),
                               this);
            return true;
        }
    }
    return QWidget::event(event);
}

} // namespace ts
