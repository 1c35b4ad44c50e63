#pragma once
// RunCompareView: one metric of several runs overlaid on one axis (QCustomPlot), one graph per
// run: against step, epoch (runs with different batch sizes line up) or time since each run
// started. Each series is M4-downsampled by the store to about one bucket per pixel column of
// the visible step range, and re-read when the user zooms or pans, so a 1M-step run plots as
// fast as a short one and spikes stay visible at every zoom level.

#include <QStringList>
#include <QWidget>

#include <string>
#include <vector>

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

    // The x axis: step, epoch (fractional: step / steps per epoch of that run) or seconds since
    // the run started (interpolated between the run's start and its epoch ends).
    enum class XAxis { Step, Epoch, RelativeTime };
    bool setXAxis(XAxis axis, QString* error = nullptr);
    XAxis xAxis() const { return m_xAxis; }

    QCustomPlot* plot() const { return m_plot; }
    QComboBox* metricBox() const { return m_metricBox; }
    QComboBox* xAxisBox() const { return m_xAxisBox; }

Q_SIGNALS:
    void errorOccurred(const QString& message);

private:
    // Reads the series for the current x range (or all of it) and replots.
    bool reload(bool rescale, QString* error);
    // A run's step -> x key map: piecewise linear through (step, key) knots, ascending.
    struct KeyMap {
        std::vector<double> steps, keys;
        double keyOf(double step) const;
        double stepOf(double key) const;
    };
    // Each compared run's name and key map, read from the store when the runs, the metric or the
    // axis change (rescale), and reused while zooming re-reads the series.
    struct RunAxis {
        QString name;
        KeyMap map;
    };
    RunAxis readRunAxis(const QString& runId) const;
    std::vector<RunAxis> m_runAxes;

    XAxis m_xAxis = XAxis::Step;
    QComboBox* m_xAxisBox;
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
