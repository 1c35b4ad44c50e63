#pragma once
// DashboardWidget: the live (or recorded) run on QCustomPlot plots sharing one x axis — loss and
// accuracy (train and validation), throughput, stacked step-time breakdown, input-stall share
// with TensorBoard's verdict lines, device / host utilisation and memory, and (only for runs that
// report them) mixed_float16's loss scale and skipped steps and a parameter-server run's
// staleness — plus the advisor's findings. A crosshair shows the values of every plot at the step under the mouse.
// Contract: GUI thread only. It reads a RunData it does not own (setData); refresh() appends the
// rows added since the last call, so a tick costs the new points, not the whole run. QCustomPlot
// draws each graph downsampled per visible pixel (adaptive sampling), so 1M-point series stay
// interactive.

#include <QElapsedTimer>
#include <QHash>
#include <QWidget>

#include <cstddef>
#include <map>
#include <string>
#include <vector>

class QCheckBox;
class QComboBox;
class QCPAxisRect;
class QCPGraph;
class QCPItemStraightLine;
class QCPItemText;
class QCPRange;
class QCPTextElement;
class QGridLayout;
class QCustomPlot;
class QLabel;
class QListWidget;
class QMouseEvent;
class QSlider;
class QTimer;

namespace ts {

class RunData;

class DashboardWidget : public QWidget {
    Q_OBJECT
public:
    enum class XAxis { Step, Epoch, WallTime };
    Q_ENUM(XAxis)

    explicit DashboardWidget(QWidget* parent = nullptr);
    ~DashboardWidget() override;

    // The run to show (null: none); rebuilds every plot. The data must outlive the widget or
    // be replaced first.
    void setData(const RunData* data);
    const RunData* data() const { return m_data; }
    // Appends what the data gained since the last refresh and replots (queued, coalesced).
    void refresh();

    void setXAxis(XAxis axis);
    XAxis xAxis() const { return m_xAxis; }
    // Exponential moving average weight, TensorBoard style (0: raw; 0.99: very smooth).
    void setSmoothing(double weight);
    double smoothing() const { return m_smoothing; }
    void setLogScale(bool on);
    bool logScale() const { return m_logScale; }
    // Follow: the x range tracks the newest data. Zooming or panning by hand turns it off;
    // double-click (or setFollow(true)) turns it back on.
    void setFollow(bool on);
    bool follow() const { return m_follow; }

    // The most CPU the live replots may take, as a fraction of the whole machine (all cores):
    // replots run at up to 30 Hz, fewer when a frame costs more than the budget allows (a
    // dashboard must not slow the training it shows). Default 0.02. Interaction is not limited.
    void setCpuBudget(double fractionOfMachine) { m_cpuBudget = fractionOfMachine; }
    double cpuBudget() const { return m_cpuBudget; }
    // Live replots done and their mean CPU cost (ms, all five plots).
    int liveReplots() const { return m_liveReplots; }
    // Plot redraws within live replots that drew only the newly appended points (the rest
    // redrew the whole plot because an axis, the size or the set of graphs changed).
    int incrementalDraws() const { return m_incrementalDraws; }
    double frameMs() const { return m_frameMs; }

    // Moves every plot's crosshair to x (in the current x units) and fills the readout.
    void setCrosshair(double x);
    QString readout() const;
    void setXRange(double lower, double upper);

    // For tests and screenshots.
    QCustomPlot* lossPlot() const { return m_loss; }
    QCustomPlot* throughputPlot() const { return m_throughput; }
    QCustomPlot* breakdownPlot() const { return m_breakdown; }
    QCustomPlot* stallPlot() const { return m_stall; }
    QCustomPlot* devicePlot() const { return m_devices; }
    // Loss scale, skipped steps and staleness; hidden until the run reports one of them.
    QCustomPlot* healthPlot() const { return m_health; }
    std::vector<QCustomPlot*> plots() const;
    QListWidget* findingsList() const { return m_findings; }
    QLabel* verdictLabel() const { return m_verdict; }
    // Points drawn so far in the loss plot's train-loss graph (raw).
    int lossPointCount() const;

Q_SIGNALS:
    void crosshairMoved(double x);

private:
    struct Smoother {
        double last = 0;
        int64_t n = 0;
        double next(double v, double w);
    };
    void buildPlots();
    void rebuildAll();
    void appendSteps();
    void appendEpochs();
    void appendBreakdown();
    void appendDevices();
    void updateFindings();
    void updateVerdict();
    // Fits every plot to its data. `live` (following a running run): ranges keep headroom and
    // change only when the data leaves them, so most live frames redraw the graphs alone.
    void fitX(bool live = false);
    void applyXRange(const QCPRange& range, QCustomPlot* source);
    void onPlotMouseMove(QCustomPlot* plot, QMouseEvent* event);
    double keyOf(double step, double wall) const;
    QCPGraph* deviceGraph(const std::string& key, const QString& name, bool memory);
    // Adds a point to one of the health plot's graphs, showing the plot (and the graph in its
    // legend) at the graph's first point.
    void addHealthPoint(QCPGraph* graph, double key, double value);
    void showHealthPlot(bool on);
    void replotAll();
    void scheduleLiveReplot();
    void liveReplot();
    void showEvent(QShowEvent* event) override;

    const RunData* m_data = nullptr;
    XAxis m_xAxis = XAxis::Step;
    double m_smoothing = 0.6;
    bool m_logScale = false;
    bool m_follow = true;
    bool m_syncing = false;
    double m_crosshairX = 0;
    bool m_hasCrosshair = false;

    QComboBox* m_xAxisBox = nullptr;
    QSlider* m_smoothingSlider = nullptr;
    QLabel* m_smoothingLabel = nullptr;
    QCheckBox* m_logBox = nullptr;
    QCheckBox* m_followBox = nullptr;
    QLabel* m_readout = nullptr;
    QLabel* m_verdict = nullptr;
    QListWidget* m_findings = nullptr;
    QCustomPlot *m_loss = nullptr, *m_throughput = nullptr, *m_breakdown = nullptr, *m_stall = nullptr,
                *m_devices = nullptr, *m_health = nullptr;
    QCPTextElement* m_healthTitle = nullptr;
    QGridLayout* m_grid = nullptr;
    std::vector<QCPItemStraightLine*> m_crosshairs;

    // Graphs, and how many rows of each column they have drawn.
    QCPGraph *m_lossRaw = nullptr, *m_lossSmooth = nullptr, *m_accSmooth = nullptr, *m_valLoss = nullptr,
             *m_valAcc = nullptr, *m_rate = nullptr, *m_stallShare = nullptr, *m_lossScale = nullptr,
             *m_skipped = nullptr, *m_staleness = nullptr;
    std::vector<QCPGraph*> m_stack;  // input, forward, backward, communication, optimizer, other
    std::map<std::string, QCPGraph*> m_deviceGraphs;
    Smoother m_lossEma, m_accEma, m_stallEma;
    std::size_t m_stepRows = 0, m_epochRows = 0, m_breakdownRows = 0;
    std::map<std::string, std::size_t> m_deviceRows;
    std::size_t m_findingCount = static_cast<std::size_t>(-1);
    uint64_t m_findingRevision = 0;
    double m_cpuBudget = 0.02;
    double m_frameMs = 0;            // moving average of a live frame's cost
    int m_liveReplots = 0;
    bool m_dirty = false;
    QTimer* m_replotTimer = nullptr;
    QElapsedTimer m_sinceReplot;
    QElapsedTimer m_sinceVerdict;  // the verdict's percentage is re-set at most twice a second
    // What each plot's last full replot drew around the graphs (axes, size, graphs, the data
    // generation): while it is unchanged a live frame draws only the points appended since.
    struct Frame {
        double range[6] = {};   // x, y, y2: lower and upper
        int graphs = -1, width = 0, height = 0;
        int generation = -1;
        bool operator==(const Frame&) const = default;
    };
    // Draws each graph's points appended since the last draw onto the graph layer's buffer
    // (without clearing it) and composes the plot.
    void drawNewPoints(QCustomPlot* plot);
    // Every graph of `plot` is drawn up to its current size (after a full replot).
    void markDrawn(QCustomPlot* plot);
    std::vector<Frame> m_lastFull;
    // Bumped whenever plotted data is cleared or re-keyed, so nothing drawn before is kept.
    int m_generation = 0;
    QHash<const QCPGraph*, int> m_drawn;  // points of each graph on its layer's buffer
    int m_incrementalDraws = 0;
};

} // namespace ts
