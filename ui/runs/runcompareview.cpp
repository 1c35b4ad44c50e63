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
    : QWidget(parent), m_metricBox(new QComboBox(this)), m_status(new QLabel(this)), m_plot(new QCustomPlot(this)),
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

    auto* top = new QHBoxLayout;
    top->addWidget(new QLabel(tr("Metric:"), this));
    top->addWidget(m_metricBox);
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
    std::vector<std::string> ids;
    for (const QString& id : m_runs)
        ids.push_back(id.toStdString());
    store::SeriesQuery query;
    query.buckets = std::max(64, m_plot->axisRect()->width());
    if (!rescale) {
        const QCPRange r = m_plot->xAxis->range();
        query.step0 = static_cast<int64_t>(std::floor(r.lower));
        query.step1 = static_cast<int64_t>(std::ceil(r.upper));
        if (query.step1 <= query.step0)
            query.step1 = query.step0 + 1;
    }
    auto series = m_store->compare(ids, m_metric.toStdString(), query);
    if (!series.ok()) {
        const QString message = tr("Could not read %1 of runs %2 from %3: %4")
                                    .arg(m_metric, m_runs.join(QStringLiteral(", ")), qs(m_store->path()),
                                         qs(series.error().toString()));
        m_status->setText(message);
        if (error)
            *error = message;
        return done(false);
    }
    int64_t samples = 0;
    bool downsampled = false;
    for (std::size_t i = 0; i < series->size(); ++i) {
        const store::Series& s = (*series)[i];
        QCPGraph* g = m_plot->addGraph();
        auto info = m_store->run(s.runId);
        const QString name = info.ok() && !info->name.empty() ? qs(info->name) : qs(s.runId);
        g->setName(s.points.empty() ? tr("%1 (no %2)").arg(name, m_metric) : name);
        g->setPen(QPen(runColor(static_cast<int>(i)), 1.5));
        QVector<double> keys, values;
        keys.reserve(static_cast<int>(s.points.size()));
        values.reserve(static_cast<int>(s.points.size()));
        for (const store::SeriesPoint& p : s.points) {
            keys << static_cast<double>(p.step);
            values << p.value;
        }
        g->setData(keys, values, true);
        samples += s.samples;
        downsampled |= s.downsampled;
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
                          .arg(downsampled ? tr(", downsampled per pixel") : QString()));
    return done(true);
}

} // namespace ts
