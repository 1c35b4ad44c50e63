#pragma once
// RunCompareView: one metric of several runs overlaid on one step axis (QCustomPlot), one graph
// per run. Each series is M4-downsampled by the store to about one bucket per pixel column of
// the visible step range, and re-read when the user zooms or pans, so a 1M-step run plots as
// fast as a short one and spikes stay visible at every zoom level.

#include <QStringList>
#include <QWidget>

class QComboBox;
class QCustomPlot;
class QLabel;
class QTimer;

namespace ts {

namespace store {
class RunStore;
}

class RunCompareView : public QWidget {
    Q_OBJECT
public:
    explicit RunCompareView(QWidget* parent = nullptr);

    // The store the runs are read from (not owned; nullptr clears the plot).
    void setStore(store::RunStore* store);
    // Shows `runIds`; keeps the current metric when any of them has it, else picks "loss" (or
    // the first metric any of them has). `error` names the run that could not be read.
    bool setRuns(const QStringList& runIds, QString* error = nullptr);
    QStringList runs() const { return m_runs; }
    bool setMetric(const QString& metric, QString* error = nullptr);
    QString metric() const { return m_metric; }
    QStringList availableMetrics() const { return m_metrics; }

    QCustomPlot* plot() const { return m_plot; }
    QComboBox* metricBox() const { return m_metricBox; }

Q_SIGNALS:
    void errorOccurred(const QString& message);

private:
    // Reads the series for the current step range (or all of it) and replots.
    bool reload(bool rescale, QString* error);

    store::RunStore* m_store = nullptr;
    QStringList m_runs, m_metrics;
    QString m_metric;
    QComboBox* m_metricBox;
    QLabel* m_status;
    QCustomPlot* m_plot;
    QTimer* m_requery;
    bool m_reloading = false;
};

} // namespace ts
