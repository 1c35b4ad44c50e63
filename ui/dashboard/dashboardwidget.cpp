#include "dashboard/dashboardwidget.h"

#include <QCheckBox>
#include <QTimer>
#include <QComboBox>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QListWidget>
#include <QSlider>
#include <QSplitter>
#include <QVBoxLayout>

#include <qcustomplot.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <thread>

#include "session/rundata.h"

namespace ts {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The step-part colours of the breakdown, in stacking order (TensorBoard's overview order).
struct Part {
    const char* name;
    QColor color;
};
const std::vector<Part>& parts()
{
    static const std::vector<Part> p = {{"input", QColor(0xe0, 0x6c, 0x4c)},    {"forward", QColor(0x4c, 0x8b, 0xe0)},
                                        {"backward", QColor(0x6a, 0x5a, 0xcd)}, {"communication", QColor(0xd4, 0xa0, 0x17)},
                                        {"optimizer", QColor(0x3c, 0xa5, 0x5c)}, {"other", QColor(0x99, 0x99, 0x99)}};
    return p;
}

QColor seriesColor(int i)
{
    static const QColor c[] = {QColor(0x1f, 0x77, 0xb4), QColor(0xff, 0x7f, 0x0e), QColor(0x2c, 0xa0, 0x2c),
                               QColor(0xd6, 0x27, 0x28), QColor(0x94, 0x67, 0xbd), QColor(0x8c, 0x56, 0x4b),
                               QColor(0xe3, 0x77, 0xc2), QColor(0x17, 0xbe, 0xcf)};
    return c[static_cast<std::size_t>(i) % (sizeof c / sizeof c[0])];
}

QCustomPlot* makePlot(const QString& title, const QString& yLabel)
{
    auto* p = new QCustomPlot;
    p->setMinimumHeight(110);
    p->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    p->axisRect()->setRangeDrag(Qt::Horizontal);
    p->axisRect()->setRangeZoom(Qt::Horizontal);
    p->setNoAntialiasingOnDrag(true);
    // Antialiased lines and fills cost 3x the frame (13.8 vs 4.2 ms for the five plots here);
    // live plots redraw many times a second on cores the training uses.
    p->setNotAntialiasedElements(QCP::aeAll);
    p->setPlottingHint(QCP::phFastPolylines, true);
    p->plotLayout()->insertRow(0);
    QFont f = p->font();
    f.setBold(true);
    auto* titleText = new QCPTextElement(p, title, f);
    p->plotLayout()->addElement(0, 0, titleText);
    // Graphs and items draw on "main", given its own paint buffer so that a live frame can
    // redraw it alone while axes, grid, title and legend keep their buffers.
    titleText->setLayer(QStringLiteral("axes"));
    p->layer(QStringLiteral("main"))->setMode(QCPLayer::lmBuffered);
    p->yAxis->setLabel(yLabel);
    p->legend->setVisible(true);
    QFont lf = p->font();
    lf.setPointSizeF(lf.pointSizeF() * 0.85);
    p->legend->setFont(lf);
    p->legend->setRowSpacing(0);
    p->legend->setBrush(QColor(255, 255, 255, 190));  // the data shows through
    p->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignRight);
    p->setObjectName(title);
    return p;
}

QCPGraph* addGraph(QCustomPlot* p, const QString& name, const QColor& color, double width = 1.5, bool right = false)
{
    QCPGraph* g = p->addGraph(p->xAxis, right ? p->yAxis2 : p->yAxis);
    g->setName(name);
    QPen pen(color);
    pen.setWidthF(width);
    g->setPen(pen);
    g->setAdaptiveSampling(true);
    return g;
}

// Index of the last row with column value <= x (columns ascending); -1 if none.
long lastAtOrBefore(const std::vector<double>& col, double x)
{
    auto it = std::upper_bound(col.begin(), col.end(), x);
    return static_cast<long>(it - col.begin()) - 1;
}

// QCPLayer::replot clears the layer's buffer before drawing; drawing the newest points of a
// live plot must add to it. drawToPaintBuffer is protected: reach it through a derived class.
struct LayerPainter : QCPLayer {
    static void drawOnto(QCPLayer* layer) { (layer->*(&LayerPainter::drawToPaintBuffer))(); }
};

double threadCpuMs()
{
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

} // namespace

double DashboardWidget::Smoother::next(double v, double w)
{
    if (!std::isfinite(v)) return v;
    last = last * w + (1 - w) * v;
    ++n;
    const double debias = 1 - std::pow(w, static_cast<double>(n));
    return debias > 0 ? last / debias : v;
}

DashboardWidget::DashboardWidget(QWidget* parent) : QWidget(parent)
{
    auto* controls = new QHBoxLayout;
    controls->addWidget(new QLabel(tr("X axis:")));
    m_xAxisBox = new QComboBox;
    m_xAxisBox->addItems({tr("Step"), tr("Epoch"), tr("Wall time")});
    m_xAxisBox->setObjectName("xAxis");
    controls->addWidget(m_xAxisBox);
    controls->addSpacing(12);
    controls->addWidget(new QLabel(tr("Smoothing:")));
    m_smoothingSlider = new QSlider(Qt::Horizontal);
    m_smoothingSlider->setRange(0, 99);
    m_smoothingSlider->setValue(static_cast<int>(m_smoothing * 100));
    m_smoothingSlider->setMaximumWidth(140);
    m_smoothingSlider->setObjectName("smoothing");
    controls->addWidget(m_smoothingSlider);
    m_smoothingLabel = new QLabel(QString::number(m_smoothing, 'f', 2));
    controls->addWidget(m_smoothingLabel);
    controls->addSpacing(12);
    m_logBox = new QCheckBox(tr("Log scale"));
    m_logBox->setObjectName("logScale");
    controls->addWidget(m_logBox);
    m_followBox = new QCheckBox(tr("Follow"));
    m_followBox->setChecked(true);
    m_followBox->setToolTip(tr("Keep the newest data in view (double-click a plot to fit and follow again)"));
    m_followBox->setObjectName("follow");
    controls->addWidget(m_followBox);
    controls->addStretch(1);
    m_verdict = new QLabel;
    m_verdict->setObjectName("verdict");
    m_verdict->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
    controls->addWidget(m_verdict);

    m_readout = new QLabel(tr("Move the mouse over a plot to read every plot at that step."));
    m_readout->setObjectName("readout");
    m_readout->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_readout->setWordWrap(true);

    buildPlots();
    m_grid = new QGridLayout;
    m_grid->setSpacing(4);
    m_grid->addWidget(m_loss, 0, 0);
    m_grid->addWidget(m_throughput, 0, 1);
    m_grid->addWidget(m_breakdown, 1, 0);
    m_grid->addWidget(m_stall, 1, 1);
    m_grid->addWidget(m_devices, 2, 0, 1, 2);
    auto* plotsBox = new QWidget;
    plotsBox->setLayout(m_grid);

    m_findings = new QListWidget;
    m_findings->setObjectName("findings");
    m_findings->setWordWrap(true);
    m_findings->setMaximumHeight(110);
    m_findings->setToolTip(tr("The advisor's findings on the last window of steps"));

    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);
    layout->addLayout(controls);
    layout->addWidget(m_readout);
    layout->addWidget(plotsBox, 1);
    layout->addWidget(new QLabel(tr("Advice")));
    layout->addWidget(m_findings);

    connect(m_xAxisBox, &QComboBox::currentIndexChanged, this, [this](int i) { setXAxis(static_cast<XAxis>(i)); });
    connect(m_smoothingSlider, &QSlider::valueChanged, this, [this](int v) { setSmoothing(v / 100.0); });
    connect(m_logBox, &QCheckBox::toggled, this, &DashboardWidget::setLogScale);
    connect(m_followBox, &QCheckBox::toggled, this, &DashboardWidget::setFollow);
    m_replotTimer = new QTimer(this);
    m_replotTimer->setSingleShot(true);
    connect(m_replotTimer, &QTimer::timeout, this, &DashboardWidget::liveReplot);
}

DashboardWidget::~DashboardWidget() = default;

std::vector<QCustomPlot*> DashboardWidget::plots() const { return {m_loss, m_throughput, m_breakdown, m_stall, m_devices, m_health}; }

void DashboardWidget::buildPlots()
{
    m_loss = makePlot(tr("Loss and accuracy"), tr("loss"));
    m_loss->yAxis2->setVisible(true);
    m_loss->yAxis2->setLabel(tr("accuracy"));
    m_loss->yAxis2->setRange(0, 1);
    // Opaque colours throughout (here the raw loss's blue at 27% over white): live frames draw
    // only the newest points, and a translucent pixel drawn twice where two frames meet would
    // show as a darker dot.
    m_lossRaw = addGraph(m_loss, tr("loss (raw)"), QColor(194, 218, 234), 1);
    m_lossSmooth = addGraph(m_loss, tr("loss"), QColor(0x1f, 0x77, 0xb4), 2);
    m_accSmooth = addGraph(m_loss, tr("accuracy"), QColor(0xff, 0x7f, 0x0e), 2, true);
    m_valLoss = addGraph(m_loss, tr("val loss"), QColor(0x1f, 0x77, 0xb4), 1.5);
    m_valLoss->setPen(QPen(QColor(0x1f, 0x77, 0xb4), 1.5, Qt::DashLine));
    m_valLoss->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssCircle, 6));
    m_valAcc = addGraph(m_loss, tr("val accuracy"), QColor(0xff, 0x7f, 0x0e), 1.5, true);
    m_valAcc->setPen(QPen(QColor(0xff, 0x7f, 0x0e), 1.5, Qt::DashLine));
    m_valAcc->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDiamond, 7));
    m_lossRaw->removeFromLegend();

    m_throughput = makePlot(tr("Throughput"), tr("samples/s"));
    m_rate = addGraph(m_throughput, tr("samples/s (epoch so far)"), seriesColor(2), 2);

    m_breakdown = makePlot(tr("Step time breakdown"), tr("ms per step"));
    // Each graph is a cumulative sum (input, input + forward, ...) filled down to zero with an
    // opaque brush, the largest drawn first: the same picture as fills between neighbours, at a
    // fraction of the cost (channel fills and alpha blending were most of a live frame).
    m_stack.assign(parts().size(), nullptr);
    for (std::size_t i = parts().size(); i-- > 0;) {
        const auto& part = parts()[i];
        QCPGraph* g = addGraph(m_breakdown, tr(part.name), part.color.darker(120), 1);
        g->setBrush(part.color.lighter(115));
        m_stack[i] = g;
    }
    // The legend lists the parts in stacking order, top part first.
    m_breakdown->legend->setVisible(true);

    m_stall = makePlot(tr("Input stall"), tr("% of step waiting for input"));
    m_stallShare = addGraph(m_stall, tr("input share"), parts()[0].color, 2);
    m_stallShare->setBrush(QColor(249, 235, 232));  // the input colour at 20% over white
    m_stall->yAxis->setRange(0, 30);
    for (double level : {5.0, 20.0}) {
        auto* line = new QCPItemStraightLine(m_stall);
        line->point1->setCoords(0, level);
        line->point2->setCoords(1, level);
        line->setPen(QPen(QColor(0x80, 0x80, 0x80), 1, Qt::DotLine));
        // Over the data, and off the graph layer that live frames draw onto.
        line->setLayer(QStringLiteral("axes"));
        auto* text = new QCPItemText(m_stall);
        text->position->setTypeX(QCPItemPosition::ptAxisRectRatio);
        text->position->setTypeY(QCPItemPosition::ptPlotCoords);
        text->position->setCoords(0.01, level);
        text->setPositionAlignment(Qt::AlignLeft | Qt::AlignBottom);
        text->setText(level < 10 ? tr("moderately input-bound") : tr("highly input-bound"));
        text->setColor(QColor(0x80, 0x80, 0x80));
        text->setLayer(QStringLiteral("axes"));
    }

    m_devices = makePlot(tr("Devices and host"), tr("utilisation %"));
    m_devices->yAxis->setRange(0, 105);
    m_devices->yAxis2->setVisible(true);
    m_devices->yAxis2->setLabel(tr("memory GiB"));

    // Only some runs have these (mixed_float16, parameter servers): the plot stays out of the
    // grid until one reports, and then shares the devices' row.
    m_health = makePlot(tr("Loss scale"), tr("loss scale"));
    m_health->setParent(this);  // owned while it is out of the grid (the grid reparents it)
    m_healthTitle = qobject_cast<QCPTextElement*>(m_health->plotLayout()->element(0, 0));
    m_health->yAxis->setScaleType(QCPAxis::stLogarithmic);
    auto log2 = QSharedPointer<QCPAxisTickerLog>::create();
    log2->setLogBase(2);
    m_health->yAxis->setTicker(log2);
    m_health->yAxis->setNumberFormat(QStringLiteral("f"));  // 32768, not 3.3e+04
    m_health->yAxis->setNumberPrecision(0);
    m_health->yAxis2->setVisible(true);
    m_health->yAxis2->setLabel(tr("steps"));
    m_lossScale = addGraph(m_health, tr("loss scale"), seriesColor(4), 2);
    m_lossScale->setLineStyle(QCPGraph::lsStepLeft);  // the scale holds until it changes
    m_skipped = addGraph(m_health, tr("skipped steps (total)"), seriesColor(3), 1.5, true);
    m_skipped->setLineStyle(QCPGraph::lsStepLeft);
    m_staleness = addGraph(m_health, tr("staleness (worst worker)"), seriesColor(5), 1.2, true);
    for (QCPGraph* g : {m_lossScale, m_skipped, m_staleness}) g->removeFromLegend();
    m_health->hide();

    for (QCustomPlot* p : plots()) {
        auto* line = new QCPItemStraightLine(p);
        line->setPen(QPen(QColor(0x60, 0x60, 0x60, 160), 1));
        line->point1->setCoords(0, 0);
        line->point2->setCoords(0, 1);
        line->setVisible(false);
        line->setSelectable(false);
        // The crosshair has the overlay's buffer to itself: moving it redraws nothing else.
        line->setLayer(QStringLiteral("overlay"));
        p->layer(QStringLiteral("overlay"))->setMode(QCPLayer::lmBuffered);
        m_crosshairs.push_back(line);
        connect(p, &QCustomPlot::afterReplot, this, [this, p] { markDrawn(p); });
        connect(p->xAxis, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), this,
                [this, p](const QCPRange& r) { applyXRange(r, p); });
        connect(p, &QCustomPlot::mouseMove, this, [this, p](QMouseEvent* e) { onPlotMouseMove(p, e); });
        connect(p, &QCustomPlot::mouseDoubleClick, this, [this](QMouseEvent*) { setFollow(true); });
        // A wheel or a drag means the user wants this range: stop following the newest data.
        connect(p, &QCustomPlot::mouseWheel, this, [this](QWheelEvent*) { setFollow(false); });
        connect(p, &QCustomPlot::mousePress, this, [this](QMouseEvent*) { setFollow(false); });
    }
}

void DashboardWidget::setData(const RunData* data)
{
    m_data = data;
    rebuildAll();
}

void DashboardWidget::setXAxis(XAxis axis)
{
    if (m_xAxisBox->currentIndex() != static_cast<int>(axis)) m_xAxisBox->setCurrentIndex(static_cast<int>(axis));
    if (m_xAxis == axis) return;
    m_xAxis = axis;
    QString label = axis == XAxis::Step ? tr("step") : axis == XAxis::Epoch ? tr("epoch") : tr("wall time");
    for (QCustomPlot* p : plots()) {
        p->xAxis->setLabel(label);
        if (axis == XAxis::WallTime) {
            QSharedPointer<QCPAxisTickerTime> t(new QCPAxisTickerTime);
            t->setTimeFormat("%m:%s");
            p->xAxis->setTicker(t);
        } else {
            p->xAxis->setTicker(QSharedPointer<QCPAxisTicker>(new QCPAxisTicker));
        }
    }
    m_hasCrosshair = false;
    rebuildAll();
    fitX();
}

void DashboardWidget::setSmoothing(double weight)
{
    weight = std::clamp(weight, 0.0, 0.99);
    if (m_smoothingSlider->value() != static_cast<int>(std::lround(weight * 100)))
        m_smoothingSlider->setValue(static_cast<int>(std::lround(weight * 100)));
    m_smoothingLabel->setText(QString::number(weight, 'f', 2));
    if (std::abs(weight - m_smoothing) < 1e-9) return;
    m_smoothing = weight;
    rebuildAll();
}

void DashboardWidget::setLogScale(bool on)
{
    if (m_logBox->isChecked() != on) m_logBox->setChecked(on);
    if (m_logScale == on) return;
    m_logScale = on;
    if (on) {
        m_loss->yAxis->setScaleType(QCPAxis::stLogarithmic);
        m_loss->yAxis->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
    } else {
        m_loss->yAxis->setScaleType(QCPAxis::stLinear);
        m_loss->yAxis->setTicker(QSharedPointer<QCPAxisTicker>(new QCPAxisTicker));
    }
    fitX();
    replotAll();
}

void DashboardWidget::setFollow(bool on)
{
    if (m_followBox->isChecked() != on) m_followBox->setChecked(on);
    if (m_follow == on) return;
    m_follow = on;
    if (on) {
        fitX();
        replotAll();
    }
}

double DashboardWidget::keyOf(double step, double wall) const
{
    switch (m_xAxis) {
    case XAxis::Step: return step;
    case XAxis::WallTime: return wall;
    case XAxis::Epoch: {
        const int64_t spe = m_data ? m_data->stepsPerEpoch() : 0;
        if (spe > 0) return step / static_cast<double>(spe);
        const int64_t last = m_data ? std::max<int64_t>(1, m_data->lastStep()) : 1;
        return step / static_cast<double>(last);  // first epoch: the fraction of it so far
    }
    }
    return step;
}

void DashboardWidget::rebuildAll()
{
    ++m_generation;
    for (QCustomPlot* p : plots())
        for (int i = 0; i < p->graphCount(); ++i) p->graph(i)->data()->clear();
    for (auto& [key, g] : m_deviceGraphs) m_devices->removeGraph(g);
    m_deviceGraphs.clear();
    m_deviceRows.clear();
    m_lossEma = m_accEma = m_stallEma = Smoother();
    m_stepRows = m_epochRows = m_breakdownRows = 0;
    m_findingCount = static_cast<std::size_t>(-1);
    for (QCPGraph* g : {m_lossScale, m_skipped, m_staleness}) g->removeFromLegend();
    showHealthPlot(false);
    refresh();
}

void DashboardWidget::refresh()
{
    if (!m_data) {
        replotAll();
        return;
    }
    // In epoch mode the keys depend on the epoch length, known once the first epoch ends.
    if (m_xAxis == XAxis::Epoch && m_data->stepsPerEpoch() == 0 && m_stepRows > 0) {
        ++m_generation;
        for (QCustomPlot* p : plots())
            for (int i = 0; i < p->graphCount(); ++i) p->graph(i)->data()->clear();
        m_lossEma = m_accEma = m_stallEma = Smoother();
        m_stepRows = m_epochRows = m_breakdownRows = 0;
        m_deviceRows.clear();
    }
    appendSteps();
    appendEpochs();
    appendBreakdown();
    appendDevices();
    updateFindings();
    updateVerdict();
    // While the run trains, ranges keep headroom (few full replots); once it has ended, the plots
    // fit its data exactly.
    const auto state = m_data->state();
    if (m_follow) fitX(state == telemetry::RunState::Running || state == telemetry::RunState::Paused);
    if (m_hasCrosshair) setCrosshair(m_crosshairX);
    scheduleLiveReplot();
}

void DashboardWidget::showEvent(QShowEvent* event)
{
    QWidget::showEvent(event);
    if (m_dirty) liveReplot();
}

void DashboardWidget::scheduleLiveReplot()
{
    m_dirty = true;
    if (!isVisible()) return;  // another tab is in front: draw when shown
    if (m_replotTimer->isActive()) return;  // a replot is already due
    // The interval that keeps the replots within the CPU budget, never above ~30 Hz (30 ms, not
    // 33: the session drains every 33 ms and a tick that comes a little early must still draw).
    static const double cores = std::max(1u, std::thread::hardware_concurrency());
    const double budgetMsPerSecond = std::max(1e-3, m_cpuBudget * cores * 1000.0);
    const double intervalMs = std::max(30.0, 1000.0 * m_frameMs / budgetMsPerSecond);
    const double waited = m_sinceReplot.isValid() ? static_cast<double>(m_sinceReplot.elapsed()) : 1e9;
    if (waited >= intervalMs) liveReplot();
    else m_replotTimer->start(static_cast<int>(intervalMs - waited));
}

void DashboardWidget::liveReplot()
{
    if (!m_dirty) return;
    m_dirty = false;
    // CPU time, not wall time: under a busy training the wall time includes the time the GUI
    // thread waited for a core, which is not what the frame takes from the training.
    const double c0 = threadCpuMs();
    const auto all = plots();
    m_lastFull.resize(all.size());
    for (std::size_t i = 0; i < all.size(); ++i) {
        QCustomPlot* p = all[i];
        if (p->isHidden()) continue;  // the health plot of a run without loss scale or staleness
        const Frame now{{p->xAxis->range().lower, p->xAxis->range().upper, p->yAxis->range().lower, p->yAxis->range().upper,
                         p->yAxis2->range().lower, p->yAxis2->range().upper},
                        p->graphCount(), p->width(), p->height(), m_generation};
        if (now == m_lastFull[i]) {
            drawNewPoints(p);
            ++m_incrementalDraws;
        } else {
            p->replot(QCustomPlot::rpImmediateRefresh);
            m_lastFull[i] = now;
        }
    }
    const double ms = threadCpuMs() - c0;
    m_frameMs = m_liveReplots == 0 ? ms : 0.8 * m_frameMs + 0.2 * ms;
    ++m_liveReplots;
    m_sinceReplot.restart();
}

void DashboardWidget::markDrawn(QCustomPlot* plot)
{
    for (int g = 0; g < plot->graphCount(); ++g) m_drawn[plot->graph(g)] = plot->graph(g)->data()->size();
}

void DashboardWidget::drawNewPoints(QCustomPlot* p)
{
    QCPLayer* layer = p->layer(QStringLiteral("main"));
    // Each graph draws from its last drawn point (so the line joins up) to its newest; the
    // full containers are swapped back in afterwards. Graphs own the layer: items live on the
    // axes and overlay layers.
    std::vector<std::pair<QCPGraph*, QSharedPointer<QCPGraphDataContainer>>> swapped;
    bool any = false;
    double keyLo = 0, keyHi = 0;  // the key span of what is drawn now
    for (int gi = 0; gi < p->graphCount(); ++gi) {
        QCPGraph* g = p->graph(gi);
        QSharedPointer<QCPGraphDataContainer> full = g->data();
        const int n = full->size();
        const int drawn = m_drawn.value(g, 0);
        if (n < drawn) {
            // Data went away (never in a live run): start the layer afresh.
            for (auto& [graph, data] : swapped) graph->setData(data);
            layer->replot();
            p->repaint();
            markDrawn(p);
            return;
        }
        // Graphs without new points draw from one shared empty container.
        static const auto nothing = QSharedPointer<QCPGraphDataContainer>::create();
        QSharedPointer<QCPGraphDataContainer> delta = nothing;
        if (n > drawn) {
            delta = QSharedPointer<QCPGraphDataContainer>::create();
            for (auto it = full->constBegin() + std::max(0, drawn - 1); it != full->constEnd(); ++it) delta->add(*it);
            const double lo = delta->constBegin()->key, hi = (delta->constEnd() - 1)->key;
            keyLo = any ? std::min(keyLo, lo) : lo;
            keyHi = any ? std::max(keyHi, hi) : hi;
            any = true;
        }
        g->setData(delta);
        swapped.emplace_back(g, full);
    }
    if (any) LayerPainter::drawOnto(layer);
    for (auto& [graph, data] : swapped) graph->setData(data);
    markDrawn(p);
    if (!any) return;
    // Compose only the columns the new points touched (the pen's width either side): blending
    // the whole of every layer's buffer was two thirds of an incremental frame.
    const QRect axes = p->axisRect()->rect();
    const double x0 = p->xAxis->coordToPixel(keyLo), x1 = p->xAxis->coordToPixel(keyHi);
    const int left = static_cast<int>(std::floor(std::min(x0, x1))) - 4, right = static_cast<int>(std::ceil(std::max(x0, x1))) + 4;
    const QRect dirty = QRect(QPoint(left, axes.top() - 4), QPoint(right, axes.bottom() + 4)).intersected(p->rect());
    // repaint, not update: compose now, so the frame's cost is measured here.
    if (!dirty.isEmpty()) p->repaint(dirty);
}

void DashboardWidget::appendSteps()
{
    const StepColumns& s = m_data->steps();
    for (; m_stepRows < s.step.size(); ++m_stepRows) {
        const std::size_t i = m_stepRows;
        const double k = keyOf(s.step[i], s.wall[i]);
        m_lossRaw->addData(k, s.loss[i]);
        m_lossSmooth->addData(k, m_lossEma.next(s.loss[i], m_smoothing));
        m_accSmooth->addData(k, m_accEma.next(s.accuracy[i], m_smoothing));
        m_rate->addData(k, s.samplesPerSec[i]);
        if (std::isfinite(s.lossScale[i]) && s.lossScale[i] > 0) {
            addHealthPoint(m_lossScale, k, s.lossScale[i]);
            if (std::isfinite(s.skippedSteps[i])) addHealthPoint(m_skipped, k, s.skippedSteps[i]);
        }
        if (std::isfinite(s.staleness[i])) addHealthPoint(m_staleness, k, s.staleness[i]);
    }
}

void DashboardWidget::addHealthPoint(QCPGraph* graph, double key, double value)
{
    if (graph->data()->isEmpty()) {
        graph->addToLegend();
        const bool scale = !m_lossScale->data()->isEmpty() || graph == m_lossScale;
        const bool stale = !m_staleness->data()->isEmpty() || graph == m_staleness;
        m_healthTitle->setText(scale && stale ? tr("Loss scale and staleness") : scale ? tr("Loss scale (mixed_float16)")
                                                                                       : tr("Staleness (parameter servers)"));
        m_health->yAxis->setVisible(scale);  // the log axis is the loss scale's alone
        showHealthPlot(true);
    }
    graph->addData(key, value);
}

void DashboardWidget::showHealthPlot(bool on)
{
    if (on == !m_health->isHidden()) return;
    m_grid->removeWidget(m_devices);
    if (on) {
        m_grid->addWidget(m_devices, 2, 0);
        m_grid->addWidget(m_health, 2, 1);
        m_health->show();
    } else {
        m_grid->removeWidget(m_health);
        m_health->hide();
        m_grid->addWidget(m_devices, 2, 0, 1, 2);
    }
}

void DashboardWidget::appendEpochs()
{
    const EpochColumns& e = m_data->epochs();
    for (; m_epochRows < e.epoch.size(); ++m_epochRows) {
        const std::size_t i = m_epochRows;
        const double k = keyOf(e.step[i], e.wall[i]);
        if (std::isfinite(e.valLoss[i])) m_valLoss->addData(k, e.valLoss[i]);
        if (std::isfinite(e.valAccuracy[i])) m_valAcc->addData(k, e.valAccuracy[i]);
    }
}

void DashboardWidget::appendBreakdown()
{
    const BreakdownColumns& b = m_data->breakdown();
    const std::vector<const std::vector<double>*> cols = {&b.input, &b.forward, &b.backward, &b.communication, &b.optimizer, &b.other};
    for (; m_breakdownRows < b.step.size(); ++m_breakdownRows) {
        const std::size_t i = m_breakdownRows;
        const double k = keyOf(b.step[i], b.wall[i]);
        double sum = 0;
        for (std::size_t p = 0; p < cols.size(); ++p) {
            sum += std::max(0.0, (*cols[p])[i]) * 1e3;
            m_stack[p]->addData(k, sum);
        }
        const double share = b.total[i] > 0 ? 100.0 * b.input[i] / b.total[i] : 0;
        m_stallShare->addData(k, m_stallEma.next(share, m_smoothing));
    }
}

QCPGraph* DashboardWidget::deviceGraph(const std::string& key, const QString& name, bool memory)
{
    auto it = m_deviceGraphs.find(key);
    if (it != m_deviceGraphs.end()) return it->second;
    const int n = static_cast<int>(m_deviceGraphs.size());
    QCPGraph* g = addGraph(m_devices, name, seriesColor(n), memory ? 1.5 : 1.2, memory);
    if (memory) g->setPen(QPen(seriesColor(n), 1.5, Qt::DashLine));
    m_deviceGraphs[key] = g;
    return g;
}

void DashboardWidget::appendDevices()
{
    for (const auto& [label, d] : m_data->devices()) {
        std::size_t& rows = m_deviceRows[label];
        // "host" here, "worker:1 host" for a remote worker's machine.
        const bool host = label == "host" || (label.size() > 5 && label.compare(label.size() - 5, 5, " host") == 0);
        const std::string who = label == "host" ? std::string() : label.substr(0, label.size() - 4);  // "worker:1 "
        const QString whoText = QString::fromStdString(who);
        for (; rows < d.step.size(); ++rows) {
            const std::size_t i = rows;
            const double k = keyOf(d.step[i], d.wall[i]);
            if (host) {
                for (std::size_t c = 0; c < d.perCore.size(); ++c)
                    if (i < d.perCore[c].size() && std::isfinite(d.perCore[c][i]))
                        deviceGraph(who + "core" + std::to_string(c), whoText + tr("core %1").arg(c), false)->addData(k, 100 * d.perCore[c][i]);
                if (std::isfinite(d.processCpu[i]) && !d.perCore.empty())
                    deviceGraph(who + "process", who.empty() ? tr("this process (all cores)") : whoText + tr("process (all cores)"), false)
                        ->addData(k, 100 * d.processCpu[i] / static_cast<double>(d.perCore.size()));
                if (d.memoryUsed[i] > 0) deviceGraph(who + "host-mem", whoText + tr("process memory"), true)->addData(k, d.memoryUsed[i] / kGiB);
            } else {
                if (std::isfinite(d.utilisation[i]))
                    deviceGraph(label, QString::fromStdString(label), false)->addData(k, 100 * d.utilisation[i]);
                if (d.memoryUsed[i] > 0)
                    deviceGraph(label + "-mem", tr("%1 memory").arg(QString::fromStdString(label)), true)->addData(k, d.memoryUsed[i] / kGiB);
            }
        }
    }
}

void DashboardWidget::updateFindings()
{
    const auto& f = m_data->findings();
    if (f.size() == m_findingCount && m_data->revision() == m_findingRevision) return;
    // Findings change rarely (each epoch); rebuilding the short list is cheap.
    QStringList items;
    for (const auto& x : f)
        items << QStringLiteral("[%1] %2 — %3 (steps %4–%5)")
                     .arg(QString::fromStdString(x.severity), QString::fromStdString(x.message),
                          QString::fromStdString(x.recommendation))
                     .arg(x.firstStep)
                     .arg(x.lastStep);
    QStringList current;
    for (int i = 0; i < m_findings->count(); ++i) current << m_findings->item(i)->text();
    if (current != items) {
        m_findings->clear();
        m_findings->addItems(items);
    }
    m_findingCount = f.size();
    m_findingRevision = m_data->revision();
}

void DashboardWidget::updateVerdict()
{
    const double share = m_data->inputShare();
    if (!std::isfinite(share)) {
        m_verdict->clear();
        return;
    }
    const QString verdict = QString::fromLatin1(RunData::inputVerdict(share));
    // Called at 30 Hz, but new text re-lays out the whole page (the label sits in the scroll
    // area's layout) and a new style sheet re-polishes it: the percentage is refreshed twice a
    // second, a change of verdict at once.
    const bool sameVerdict = m_verdict->text().endsWith(QStringLiteral("— %1 input-bound").arg(verdict));
    const bool live = m_data->state() == telemetry::RunState::Running;
    if (live && sameVerdict && m_sinceVerdict.isValid() && m_sinceVerdict.elapsed() < 500) return;
    m_sinceVerdict.restart();
    const QString text = tr("Input: %1% of step time (last 50 steps) — %2 input-bound").arg(100 * share, 0, 'f', 1).arg(verdict);
    if (m_verdict->text() != text) m_verdict->setText(text);
    const QColor c = verdict == "not" ? QColor(0x2c, 0xa0, 0x2c) : verdict == "moderately" ? QColor(0xd4, 0xa0, 0x17) : QColor(0xd6, 0x27, 0x28);
    const QString style = QStringLiteral("QLabel { color: %1; font-weight: bold; }").arg(c.name());
    if (m_verdict->styleSheet() != style) m_verdict->setStyleSheet(style);
}

void DashboardWidget::fitX(bool live)
{
    double lo = 0, hi = 0;
    bool any = false;
    for (QCustomPlot* p : plots())
        for (int i = 0; i < p->graphCount(); ++i) {
            bool found = false;
            const QCPRange r = p->graph(i)->getKeyRange(found);
            if (!found) continue;
            lo = any ? std::min(lo, r.lower) : r.lower;
            hi = any ? std::max(hi, r.upper) : r.upper;
            any = true;
        }
    if (!any) return;
    if (hi <= lo) hi = lo + 1;
    m_syncing = true;
    // Live: the x range doubles when the data reaches its end, so the axes change a few times
    // per run (log2 of its length) instead of every frame.
    QCPRange x(lo, hi);
    if (live) {
        const QCPRange old = m_loss->xAxis->range();
        if (old.lower == lo && hi <= old.upper && (hi - lo) >= 0.45 * old.size()) x = old;
        else x = QCPRange(lo, lo + (hi - lo) * 2.0);
    }
    for (QCustomPlot* p : plots()) {
        p->xAxis->setRange(x);
        for (QCPAxis* axis : {p->yAxis, p->yAxis2}) {
            const QCPRange old = axis->range();
            bool first = true;
            for (int i = 0; i < p->graphCount(); ++i) {
                QCPGraph* g = p->graph(i);
                if (g->valueAxis() != axis || g->data()->isEmpty()) continue;
                g->rescaleValueAxis(!first, true);
                first = false;
            }
            if (!live || first) continue;
            // Keep the old value range while it holds the data and is not much larger; else
            // leave a margin so the next frames fit too.
            const QCPRange fit = axis->range();
            const bool log = axis->scaleType() == QCPAxis::stLogarithmic;
            const bool holds = old.lower <= fit.lower && fit.upper <= old.upper;
            const bool snug = log ? (fit.lower > 0 && old.lower > 0 && std::log(old.upper / old.lower) <= 2.0 * std::log(fit.upper / fit.lower))
                                  : old.size() <= 2.0 * fit.size();
            if (holds && snug) axis->setRange(old);
            else if (log) axis->setRange(fit.lower / 1.3, fit.upper * 1.3);
            else axis->setRange(fit.lower - 0.25 * fit.size(), fit.upper + 0.25 * fit.size());
        }
        if (p == m_stall) p->yAxis->setRange(0, std::max(25.0, p->yAxis->range().upper * (live ? 1.0 : 1.1)));
        if (p == m_devices) p->yAxis->setRange(0, 105);
        if (p == m_loss) m_loss->yAxis2->setRange(std::min(0.0, m_loss->yAxis2->range().lower), 1.0);
        if (p == m_breakdown || p == m_throughput) p->yAxis->setRangeLower(0);
        if (p == m_health) {
            p->yAxis2->setRange(0, std::max(1.0, p->yAxis2->range().upper));  // counts of steps
            // A power of two either side: the scale's steps (halvings, doublings) sit inside the
            // plot, on power-of-two ticks.
            bool found = false;
            const QCPRange scale = m_lossScale->getValueRange(found);
            if (found) p->yAxis->setRange(scale.lower / 2, scale.upper * 2);
        }
    }
    m_syncing = false;
}

void DashboardWidget::applyXRange(const QCPRange& range, QCustomPlot* source)
{
    if (m_syncing) return;
    m_syncing = true;
    for (QCustomPlot* p : plots())
        if (p != source) {
            p->xAxis->setRange(range);
            p->replot(QCustomPlot::rpQueuedReplot);
        }
    m_syncing = false;
}

void DashboardWidget::setXRange(double lower, double upper)
{
    setFollow(false);
    m_syncing = true;
    for (QCustomPlot* p : plots()) p->xAxis->setRange(lower, upper);
    m_syncing = false;
    replotAll();
}

void DashboardWidget::onPlotMouseMove(QCustomPlot* plot, QMouseEvent* event)
{
    if (!plot->axisRect()->rect().contains(event->pos())) return;
    setCrosshair(plot->xAxis->pixelToCoord(event->position().x()));
    for (QCustomPlot* p : plots()) p->layer(QStringLiteral("overlay"))->replot();
    Q_EMIT crosshairMoved(m_crosshairX);
}

void DashboardWidget::setCrosshair(double x)
{
    m_crosshairX = x;
    m_hasCrosshair = true;
    for (QCPItemStraightLine* line : m_crosshairs) {
        line->point1->setCoords(x, 0);
        line->point2->setCoords(x, 1);
        line->setVisible(true);
    }
    if (!m_data || m_data->steps().step.empty()) {
        m_readout->setText(tr("No data yet."));
        return;
    }
    // Back from the x position to a step: every column is keyed by step (or wall time).
    const StepColumns& s = m_data->steps();
    long i = -1;
    if (m_xAxis == XAxis::WallTime) i = lastAtOrBefore(s.wall, x);
    else {
        const int64_t spe = m_data->stepsPerEpoch();
        const double step = m_xAxis == XAxis::Step ? x : x * static_cast<double>(spe > 0 ? spe : std::max<int64_t>(1, m_data->lastStep()));
        i = lastAtOrBefore(s.step, step);
    }
    if (i < 0) i = 0;
    const auto row = static_cast<std::size_t>(i);
    const double step = s.step[row];
    QStringList parts;
    parts << tr("<b>step %1</b> (epoch %2, %3 s)").arg(step, 0, 'f', 0).arg(s.epoch[row], 0, 'f', 0).arg(s.wall[row], 0, 'f', 1);
    parts << tr("loss %1").arg(s.loss[row], 0, 'g', 4);
    if (std::isfinite(s.accuracy[row])) parts << tr("accuracy %1").arg(s.accuracy[row], 0, 'f', 4);
    parts << tr("%1 samples/s").arg(s.samplesPerSec[row], 0, 'f', 0);
    if (std::isfinite(s.lossScale[row]) && s.lossScale[row] > 0)
        parts << tr("loss scale %1 (%2 steps skipped)").arg(s.lossScale[row], 0, 'g', 8).arg(std::isfinite(s.skippedSteps[row]) ? s.skippedSteps[row] : 0.0, 0, 'f', 0);
    if (std::isfinite(s.staleness[row])) parts << tr("staleness %1").arg(s.staleness[row], 0, 'f', 0);
    const EpochColumns& e = m_data->epochs();
    const long ei = lastAtOrBefore(e.step, step);
    if (ei >= 0 && std::isfinite(e.valLoss[static_cast<std::size_t>(ei)]))
        parts << tr("val loss %1 / val acc %2 (epoch %3)")
                     .arg(e.valLoss[static_cast<std::size_t>(ei)], 0, 'g', 4)
                     .arg(e.valAccuracy[static_cast<std::size_t>(ei)], 0, 'f', 4)
                     .arg(e.epoch[static_cast<std::size_t>(ei)], 0, 'f', 0);
    const BreakdownColumns& b = m_data->breakdown();
    const long bi = lastAtOrBefore(b.step, step);
    if (bi >= 0) {
        const auto r = static_cast<std::size_t>(bi);
        parts << tr("step %1 ms: input %2, fwd %3, bwd %4, comm %5, opt %6, other %7")
                     .arg(b.total[r] * 1e3, 0, 'f', 2)
                     .arg(b.input[r] * 1e3, 0, 'f', 2)
                     .arg(b.forward[r] * 1e3, 0, 'f', 2)
                     .arg(b.backward[r] * 1e3, 0, 'f', 2)
                     .arg(b.communication[r] * 1e3, 0, 'f', 2)
                     .arg(b.optimizer[r] * 1e3, 0, 'f', 2)
                     .arg(b.other[r] * 1e3, 0, 'f', 2);
    }
    for (const auto& [label, d] : m_data->devices()) {
        const long di = lastAtOrBefore(d.step, step);
        if (di < 0) continue;
        const auto r = static_cast<std::size_t>(di);
        if (label == "host") {
            QStringList cores;
            for (const auto& c : d.perCore)
                if (r < c.size() && std::isfinite(c[r])) cores << QString::number(100 * c[r], 'f', 0) + "%";
            parts << tr("host cores %1, memory %2 GiB").arg(cores.join(' ')).arg(d.memoryUsed[r] / kGiB, 0, 'f', 2);
        } else if (std::isfinite(d.utilisation[r])) {
            parts << tr("%1 %2%").arg(QString::fromStdString(label)).arg(100 * d.utilisation[r], 0, 'f', 0);
        }
    }
    m_readout->setText(parts.join(QStringLiteral(" · ")));
}

QString DashboardWidget::readout() const { return m_readout->text(); }

int DashboardWidget::lossPointCount() const { return m_lossRaw->data()->size(); }

void DashboardWidget::replotAll()
{
    for (QCustomPlot* p : plots()) p->replot(QCustomPlot::rpQueuedReplot);
}

} // namespace ts
