#include "runs/runcompareview.h"

#include <QComboBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QTimer>
#include <QVBoxLayout>

#include <qcustomplot.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "store/run_store.h"

namespace ts {

namespace {

QString qs(const std::string& s)
{
    return QString::fromStdString(s);
}

// Distinct hues for up to ten runs, then they repeat.
QColor runColor(int i)
{
    static const QRgb kColors[] = {0x2563eb, 0xdc2626, 0x16a34a, 0xd97706, 0x7c3aed,
                                   0x0891b2, 0xdb2777, 0x65a30d, 0x475569, 0xea580c};
    return QColor(kColors[static_cast<std::size_t>(i) % std::size(kColors)]);
}

} // namespace

RunCompareView::RunCompareView(QWidget* parent)
    : QWidget(parent), m_xAxisBox(new QComboBox(this)), m_metricBox(new QComboBox(this)), m_status(new QLabel(this)), m_plot(new QCustomPlot(this)),
      m_requery(new QTimer(this))
{
    setObjectName(QStringLiteral("runCompareView"));
    m_metricBox->setObjectName(QStringLiteral("compareMetric"));
    m_metricBox->setToolTip(tr("The metric to overlay"));
    m_metricBox->setSizeAdjustPolicy(QComboBox::AdjustToContents);
    m_status->setObjectName(QStringLiteral("compareStatus"));
    m_plot->setObjectName(QStringLiteral("comparePlot"));
    m_plot->setMinimumHeight(160);
    m_plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    m_plot->axisRect()->setRangeDrag(Qt::Horizontal);
    m_plot->axisRect()->setRangeZoom(Qt::Horizontal);
    m_plot->xAxis->setLabel(tr("step"));
    m_plot->legend->setVisible(true);
    m_plot->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignRight);

    m_xAxisBox->setObjectName(QStringLiteral("compareXAxis"));
    m_xAxisBox->addItems({tr("Step"), tr("Epoch"), tr("Relative time")});
    m_xAxisBox->setToolTip(tr("Step; epoch (runs with different batch sizes line up); or seconds since each run started "
                              "(interpolated between its epoch ends)"));
    auto* top = new QHBoxLayout;
    top->addWidget(new QLabel(tr("Metric:"), this));
    top->addWidget(m_metricBox);
    top->addWidget(new QLabel(tr("against"), this));
    top->addWidget(m_xAxisBox);
    top->addWidget(m_status, 1);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addLayout(top);
    layout->addWidget(m_plot, 1);

    connect(m_metricBox, &QComboBox::textActivated, this, [this](const QString& metric) {
        QString error;
        if (!setMetric(metric, &error))
            Q_EMIT errorOccurred(error);
    });
    connect(m_xAxisBox, &QComboBox::activated, this, [this](int index) {
        QString error;
        if (!setXAxis(static_cast<XAxis>(index), &error))
            Q_EMIT errorOccurred(error);
    });
    // Zooming re-reads the visible steps at pixel resolution, once the wheel has settled.
    m_requery->setSingleShot(true);
    m_requery->setInterval(120);
    connect(m_requery, &QTimer::timeout, this, [this] {
        QString error;
        if (!reload(false, &error))
            Q_EMIT errorOccurred(error);
    });
    connect(m_plot->xAxis, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), this, [this] {
        if (!m_reloading)
            m_requery->start();
    });
}

void RunCompareView::setStore(store::RunStore* store)
{
    m_store = store;
    m_runs.clear();
    m_metrics.clear();
    m_metricBox->clear();
    m_plot->clearGraphs();
    m_status->clear();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

bool RunCompareView::setRuns(const QStringList& runIds, QString* error)
{
    if (!m_store) {
        if (error)
            *error = tr("No run database is open: open one before comparing runs.");
        return false;
    }
    std::set<std::string> names;
    for (const QString& id : runIds) {
        auto metrics = m_store->metricNames(id.toStdString());
        if (!metrics.ok()) {
            if (error)
                *error = tr("Could not read the metrics of run %1 from %2: %3")
                             .arg(id, qs(m_store->path()), qs(metrics.error().toString()));
            return false;
        }
        names.insert(metrics->begin(), metrics->end());
    }
    m_runs = runIds;
    m_metrics.clear();
    for (const std::string& n : names)
        m_metrics << qs(n);
    if (!m_metrics.contains(m_metric))
        m_metric = m_metrics.contains(QStringLiteral("loss")) ? QStringLiteral("loss") : m_metrics.value(0);
    m_metricBox->clear();
    m_metricBox->addItems(m_metrics);
    m_metricBox->setCurrentText(m_metric);
    return reload(true, error);
}

bool RunCompareView::setMetric(const QString& metric, QString* error)
{
    m_metric = metric;
    m_metricBox->setCurrentText(metric);
    return reload(true, error);
}

bool RunCompareView::setXAxis(XAxis axis, QString* error)
{
    m_xAxis = axis;
    m_xAxisBox->setCurrentIndex(static_cast<int>(axis));
    m_plot->xAxis->setLabel(axis == XAxis::Step ? tr("step") : axis == XAxis::Epoch ? tr("epoch") : tr("seconds since start"));
    return reload(true, error);
}

double RunCompareView::KeyMap::keyOf(double step) const
{
    if (steps.size() < 2)
        return step;
    // Past either end: the slope of the nearest segment.
    std::size_t i = static_cast<std::size_t>(std::upper_bound(steps.begin(), steps.end(), step) - steps.begin());
    i = std::clamp<std::size_t>(i, 1, steps.size() - 1);
    const double t = (step - steps[i - 1]) / (steps[i] - steps[i - 1]);
    return keys[i - 1] + t * (keys[i] - keys[i - 1]);
}

double RunCompareView::KeyMap::stepOf(double key) const
{
    if (keys.size() < 2)
        return key;
    std::size_t i = static_cast<std::size_t>(std::upper_bound(keys.begin(), keys.end(), key) - keys.begin());
    i = std::clamp<std::size_t>(i, 1, keys.size() - 1);
    const double t = (key - keys[i - 1]) / (keys[i] - keys[i - 1]);
    return steps[i - 1] + t * (steps[i] - steps[i - 1]);
}

RunCompareView::RunAxis RunCompareView::readRunAxis(const QString& runId) const
{
    RunAxis axis;
    const std::string id = runId.toStdString();
    auto info = m_store->run(id);
    axis.name = info.ok() && !info->name.empty() ? qs(info->name) : runId;
    if (m_xAxis == XAxis::Step)
        return axis;
    auto epochs = m_store->epochMetrics(id);
    if (!epochs.ok() || !info.ok())
        return axis;  // no knots: plotted by step (series() reports a damaged run itself)
    KeyMap& map = axis.map;
    // Knots strictly ascending in both step and key, from step 0 at the run's start.
    auto knot = [&map](double step, double key) {
        if (map.steps.empty() || (step > map.steps.back() && key > map.keys.back())) {
            map.steps.push_back(step);
            map.keys.push_back(key);
        }
    };
    knot(0, 0);
    const double start = static_cast<double>(info->startedUs ? info->startedUs : info->createdUs);
    for (const store::EpochRow& e : *epochs)
        knot(static_cast<double>(e.step),
             m_xAxis == XAxis::Epoch ? static_cast<double>(e.epoch) : (static_cast<double>(e.wallUs) - start) * 1e-6);
    if (m_xAxis == XAxis::RelativeTime && info->endedUs > 0 && info->lastStep > 0)
        knot(static_cast<double>(info->lastStep), (static_cast<double>(info->endedUs) - start) * 1e-6);
    if (map.steps.size() < 2) {
        map.steps.clear();  // no epoch ended yet: nothing to map through
        map.keys.clear();
    }
    return axis;
}

bool RunCompareView::reload(bool rescale, QString* error)
{
    m_reloading = true;
    m_plot->clearGraphs();
    m_plot->yAxis->setLabel(m_metric);
    auto done = [this](bool ok) {
        m_plot->replot(QCustomPlot::rpQueuedReplot);
        m_reloading = false;
        return ok;
    };
    if (!m_store || m_runs.isEmpty() || m_metric.isEmpty()) {
        m_status->setText(m_runs.isEmpty() ? tr("Select runs and press Compare.") : tr("These runs have no metrics yet."));
        return done(true);
    }
    if (rescale || m_runAxes.size() != static_cast<std::size_t>(m_runs.size())) {
        m_runAxes.clear();
        for (const QString& id : m_runs)
            m_runAxes.push_back(readRunAxis(id));
    }
    int64_t samples = 0;
    bool downsampled = false;
    QStringList unmapped;
    for (int i = 0; i < m_runs.size(); ++i) {
        const std::string id = m_runs[i].toStdString();
        const KeyMap& map = m_runAxes[static_cast<std::size_t>(i)].map;
        const QString& name = m_runAxes[static_cast<std::size_t>(i)].name;
        if (m_xAxis != XAxis::Step && map.steps.empty())
            unmapped << name;
        store::SeriesQuery query;
        query.buckets = std::max(64, m_plot->axisRect()->width());
        if (!rescale) {
            // The visible x range, back to this run's steps.
            const QCPRange r = m_plot->xAxis->range();
            query.step0 = static_cast<int64_t>(std::floor(map.stepOf(r.lower)));
            query.step1 = static_cast<int64_t>(std::ceil(map.stepOf(r.upper)));
            if (query.step1 <= query.step0)
                query.step1 = query.step0 + 1;
        }
        auto s = m_store->series(id, m_metric.toStdString(), query);
        if (!s.ok()) {
            const QString message = tr("Could not read %1 of run %2 from %3: %4")
                                        .arg(m_metric, m_runs[i], qs(m_store->path()), qs(s.error().toString()));
            m_status->setText(message);
            if (error)
                *error = message;
            return done(false);
        }
        QCPGraph* g = m_plot->addGraph();
        g->setName(s->points.empty() ? tr("%1 (no %2)").arg(name, m_metric) : name);
        g->setPen(QPen(runColor(i), 1.5));
        QVector<double> keys, values;
        keys.reserve(static_cast<int>(s->points.size()));
        values.reserve(static_cast<int>(s->points.size()));
        for (const store::SeriesPoint& p : s->points) {
            keys << map.keyOf(static_cast<double>(p.step));
            values << p.value;
        }
        g->setData(keys, values, true);
        samples += s->samples;
        downsampled |= s->downsampled;
    }
    if (rescale) {
        m_plot->rescaleAxes();
        m_plot->yAxis->scaleRange(1.05);
    } else {
        // Keep the user's x range; fit y to what is visible.
        bool any = false;
        QCPRange y;
        for (int i = 0; i < m_plot->graphCount(); ++i) {
            bool found = false;
            const QCPRange r = m_plot->graph(i)->getValueRange(found, QCP::sdBoth, m_plot->xAxis->range());
            if (!found)
                continue;
            y = any ? QCPRange(std::min(y.lower, r.lower), std::max(y.upper, r.upper)) : r;
            any = true;
        }
        if (any) {
            m_plot->yAxis->setRange(y);
            m_plot->yAxis->scaleRange(1.05);
        }
    }
    m_status->setText(tr("%n run(s), %1 sample(s)%2", nullptr, m_plot->graphCount())
                          .arg(samples)
                          .arg(downsampled ? tr(", downsampled per pixel") : QString()) +
                      (unmapped.isEmpty() ? QString()
                                          : tr("; by step (no epoch ended yet): %1").arg(unmapped.join(QStringLiteral(", ")))));
    return done(true);
}

} // namespace ts
