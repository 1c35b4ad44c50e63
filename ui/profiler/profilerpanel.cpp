#include "profiler/profilerpanel.h"

#include <QAction>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QMessageBox>
#include <QPointer>
#include <QThreadPool>
#include <QApplication>
#include <QSpinBox>
#include <QSplitter>
#include <QTabWidget>
#include <QTextBrowser>
#include <QToolBar>
#include <QToolButton>
#include <QTreeWidget>
#include <QVBoxLayout>

#include <qcustomplot.h>

#include <algorithm>
#include <set>

#include "designer/theme.h"
#include "profiler/timelinewidget.h"
#include "store/run_store.h"
#include "telemetry/breakdown.h"
#include "telemetry/chrome_trace.h"
#include "telemetry/trace_summary.h"

namespace ts {

namespace {

QString qs(const std::string& s)
{
    return QString::fromStdString(s);
}

QColor severityColor(const std::string& severity)
{
    if (severity == "high")
        return QColor(0xdc2626);
    if (severity == "moderate")
        return QColor(0xf59e0b);
    return QColor(0x3b82f6);
}

// The step parts a finding is about: its spans are the ones outlined when it is clicked.
std::set<int> partsOfFinding(const std::string& kind)
{
    using telemetry::StepPart;
    if (kind == "input-bound")
        return {static_cast<int>(StepPart::Input)};
    if (kind == "communication")
        return {static_cast<int>(StepPart::Communication)};
    if (kind == "device-idle")  // the device waits for input and for the all-reduce
        return {static_cast<int>(StepPart::Input), static_cast<int>(StepPart::Communication)};
    return {};  // host overhead is time no span covers: the steps themselves are outlined
}

} // namespace

ProfilerPanel::ProfilerPanel(QWidget* parent)
    : QWidget(parent), m_timeline(new TimelineWidget(this)), m_info(new QLabel(this)), m_legend(new QLabel(this)), m_tabs(new QTabWidget(this)),
      m_details(new QTextBrowser(this)), m_rangeLabel(new QLabel(this)), m_categoryView(new QTreeWidget(this)),
      m_topView(new QTreeWidget(this)), m_stepPlot(new QCustomPlot(this)), m_findingsView(new QTreeWidget(this)),
      m_openAction(new QAction(tr("Open Chrome Trace…"), this)), m_captureSteps(new QSpinBox(this)),
      m_captureButton(new QToolButton(this))
{
    setObjectName(QStringLiteral("profilerPanel"));

    auto* toolbar = new QToolBar(this);
    toolbar->setIconSize(QSize(16, 16));
    m_openAction->setObjectName(QStringLiteral("openTraceAction"));
    m_openAction->setToolTip(tr("Open a Chrome trace file (TrainStudio, PyTorch, TensorFlow, Horovod; .json or .json.gz)"));
    connect(m_openAction, &QAction::triggered, this, &ProfilerPanel::browseForTrace);
    connect(this, &ProfilerPanel::loadFailed, this, [this](const QString& path, const QString& error) {
        if (path != m_browsedPath)
            return;  // whoever asked handles it
        QMessageBox::warning(this, tr("Open Chrome Trace"),
                             tr("Could not open %1:\n\n%2\n\nPick a Chrome Trace Event JSON file (a torch.profiler, "
                                "TensorFlow profiler or TrainStudio trace).")
                                 .arg(QDir::toNativeSeparators(path), error));
    });
    toolbar->addAction(m_openAction);
    toolbar->addSeparator();
    toolbar->addAction(tr("Zoom In"), this, [this] { m_timeline->zoomBy(1.5); })->setToolTip(tr("Zoom in (+)"));
    toolbar->addAction(tr("Zoom Out"), this, [this] { m_timeline->zoomBy(1 / 1.5); })->setToolTip(tr("Zoom out (-)"));
    toolbar->addAction(tr("Fit"), this, [this] { m_timeline->zoomToFit(); })->setToolTip(tr("Show the whole trace (0)"));
    auto* spacer = new QWidget(toolbar);
    spacer->setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Preferred);
    toolbar->addWidget(spacer);
    toolbar->addWidget(new QLabel(tr("Capture next "), toolbar));
    m_captureSteps->setObjectName(QStringLiteral("captureSteps"));
    m_captureSteps->setRange(1, 100000);
    m_captureSteps->setValue(20);
    m_captureSteps->setSuffix(tr(" steps"));
    m_captureSteps->setToolTip(tr("How many steps of the running run to trace"));
    toolbar->addWidget(m_captureSteps);
    m_captureButton->setObjectName(QStringLiteral("captureButton"));
    m_captureButton->setText(tr("Capture"));
    m_captureButton->setToolTip(tr("Trace the next N steps of the running run and show them here"));
    connect(m_captureButton, &QToolButton::clicked, this, [this] { Q_EMIT captureRequested(m_captureSteps->value()); });
    toolbar->addWidget(m_captureButton);

    m_info->setObjectName(QStringLiteral("profilerInfo"));
    m_info->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_info->setWordWrap(true);
    m_info->setContentsMargins(6, 0, 6, 0);
    m_legend->setObjectName(QStringLiteral("categoryLegend"));
    m_legend->setContentsMargins(6, 0, 6, 0);
    m_legend->setTextFormat(Qt::RichText);
    m_legend->setWordWrap(true);

    m_details->setObjectName(QStringLiteral("spanDetails"));
    m_details->setOpenLinks(false);

    m_categoryView->setObjectName(QStringLiteral("rangeCategories"));
    m_categoryView->setHeaderLabels({tr("Category"), tr("Time"), tr("Share")});
    m_categoryView->setRootIsDecorated(false);
    m_topView->setObjectName(QStringLiteral("rangeTopSpans"));
    m_topView->setHeaderLabels({tr("Span"), tr("Category"), tr("Count"), tr("Total"), tr("Self")});
    m_topView->setRootIsDecorated(false);
    m_topView->header()->setSectionResizeMode(0, QHeaderView::Stretch);
    m_topView->header()->setStretchLastSection(false);
    auto* rangePage = new QWidget(this);
    auto* rangeLayout = new QVBoxLayout(rangePage);
    rangeLayout->setContentsMargins(4, 4, 4, 4);
    m_rangeLabel->setObjectName(QStringLiteral("rangeSummary"));
    m_rangeLabel->setText(tr("Shift+drag on the timeline to select a time range."));
    rangeLayout->addWidget(m_rangeLabel);
    auto* rangeSplit = new QSplitter(Qt::Horizontal, rangePage);
    rangeSplit->addWidget(m_categoryView);
    rangeSplit->addWidget(m_topView);
    rangeSplit->setStretchFactor(1, 2);
    rangeLayout->addWidget(rangeSplit);

    m_stepPlot->setObjectName(QStringLiteral("stepBreakdownPlot"));
    m_stepPlot->setMinimumHeight(120);
    m_stepPlot->xAxis->setLabel(tr("step"));
    m_stepPlot->yAxis->setLabel(tr("ms"));
    m_stepPlot->legend->setVisible(true);
    m_stepPlot->setInteractions(QCP::iSelectPlottables);
    m_stepPlot->setToolTip(tr("Click a bar to show its step on the timeline"));
    connect(m_stepPlot, &QCustomPlot::plottableClick, this,
            [this](QCPAbstractPlottable*, int dataIndex, QMouseEvent*) { zoomToStep(dataIndex); });

    m_findingsView->setObjectName(QStringLiteral("findingsView"));
    m_findingsView->setHeaderLabels({tr("Severity"), tr("Finding"), tr("Steps")});
    m_findingsView->setRootIsDecorated(false);
    m_findingsView->setWordWrap(true);
    m_findingsView->setUniformRowHeights(false);
    m_findingsView->header()->setSectionResizeMode(1, QHeaderView::Stretch);
    m_findingsView->header()->setStretchLastSection(false);
    connect(m_findingsView, &QTreeWidget::itemClicked, this,
            [this](QTreeWidgetItem* item) { selectFinding(item->data(0, Qt::UserRole).toInt()); });
    connect(m_findingsView, &QTreeWidget::itemActivated, this,
            [this](QTreeWidgetItem* item) { selectFinding(item->data(0, Qt::UserRole).toInt()); });

    m_tabs->setObjectName(QStringLiteral("profilerTabs"));
    m_tabs->addTab(m_details, tr("Details"));
    m_tabs->addTab(rangePage, tr("Range"));
    m_tabs->addTab(m_stepPlot, tr("Step Breakdown"));
    m_tabs->addTab(m_findingsView, tr("Findings"));

    auto* split = new QSplitter(Qt::Vertical, this);
    split->addWidget(m_timeline);
    split->addWidget(m_tabs);
    split->setStretchFactor(0, 3);
    split->setStretchFactor(1, 2);

    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->setSpacing(2);
    layout->addWidget(toolbar);
    layout->addWidget(m_info);
    layout->addWidget(m_legend);
    layout->addWidget(split, 1);

    connect(m_timeline, &TimelineWidget::spanSelected, this, [this](int span) {
        showSpanDetails(span);
        if (span >= 0)
            m_tabs->setCurrentWidget(m_details);
    });
    connect(m_timeline, &TimelineWidget::rangeSelected, this, [this](qint64 t0, qint64 t1) {
        showRangeStats(t0, t1);
        m_tabs->setCurrentIndex(1);
    });
    clear();
}

ProfilerPanel::~ProfilerPanel() = default;

QString ProfilerPanel::sourceDescription() const
{
    return m_description;
}

void ProfilerPanel::setCaptureEnabled(bool enabled)
{
    m_captureButton->setEnabled(enabled);
    m_captureSteps->setEnabled(enabled);
}

ProfilerPanel::PreparedTrace ProfilerPanel::prepareTraceFile(const QString& path)
{
    PreparedTrace out;
    auto trace = telemetry::readChromeTrace(path.toStdString());
    if (!trace.ok()) {
        out.error = qs(trace.error().toString());
        return out;
    }
    auto summary = telemetry::summariseTrace(*trace);
    if (!summary.ok()) {
        out.error = qs(summary.error().toString());
        return out;
    }
    for (const auto& b : summary->steps) {
        const int64_t start = b.stamp.wallTimeUs;  // the summary stamps a step with its start
        out.steps.push_back({b.stamp.step, start, start + static_cast<int64_t>(std::llround(b.stepSeconds * 1e6)), b});
    }
    out.description = tr("%1 (%2 trace)").arg(QFileInfo(path).fileName(), qs(trace->format));
    for (const std::string& w : trace->warnings)
        out.description += QStringLiteral(" — ") + qs(w);
    out.findings = std::move(summary->findings);
    out.data = std::make_shared<const TimelineData>(std::move(trace->spans), trace->format);
    return out;
}

bool ProfilerPanel::openTraceFile(const QString& path, QString* error)
{
    return showNow(prepareTraceFile(path), error);
}

bool ProfilerPanel::showNow(PreparedTrace prepared, QString* error)
{
    if (!prepared.error.isEmpty()) {
        if (error)
            *error = prepared.error;
        return false;
    }
    ++m_loadSerial;  // a background load still running is superseded
    m_loadingPath.clear();
    showPrepared(std::move(prepared));
    return true;
}

void ProfilerPanel::openTraceFileInBackground(const QString& path)
{
    startBackgroundLoad(path, QDir::toNativeSeparators(path), [path] { return prepareTraceFile(path); });
}

void ProfilerPanel::startBackgroundLoad(const QString& what, const QString& shownAs, std::function<PreparedTrace()> prepare)
{
    const int serial = ++m_loadSerial;
    m_loadingPath = what;
    m_info->setText(tr("Loading %1 …").arg(shownAs));
    // The result comes back through the application object: the panel may be gone by then,
    // which the QPointer tells on the GUI thread.
    QPointer<ProfilerPanel> self(this);
    QThreadPool::globalInstance()->start([self, serial, what, shownAs, prepare = std::move(prepare)] {
        auto prepared = std::make_shared<PreparedTrace>(prepare());
        QMetaObject::invokeMethod(qApp, [self, serial, what, shownAs, prepared] {
            if (!self || serial != self->m_loadSerial)
                return;  // closed, or superseded by a newer load
            self->m_loadingPath.clear();
            if (!prepared->error.isEmpty()) {
                self->m_info->setText(self->m_description.isEmpty() ? tr("Could not open %1.").arg(shownAs) : self->m_description);
                Q_EMIT self->loadFailed(what, prepared->error);
                return;
            }
            self->showPrepared(std::move(*prepared));
        }, Qt::QueuedConnection);
    });
}

void ProfilerPanel::showPrepared(PreparedTrace prepared)
{
    m_data = std::move(prepared.data);
    m_description = prepared.description;
    m_steps = std::move(prepared.steps);
    std::stable_sort(m_steps.begin(), m_steps.end(), [](const Step& a, const Step& b) { return a.step < b.step; });
    m_findings = std::move(prepared.findings);
    showLoaded();
}

ProfilerPanel::PreparedTrace ProfilerPanel::prepareStoredRun(store::RunStore& store, const QString& runId)
{
    PreparedTrace out;
    const std::string id = runId.toStdString();
    auto fail = [&](const Error& e) {
        QString message = qs(e.toString());
        if (!message.contains(runId))
            message = tr("Run %1: %2").arg(runId, message);
        out.error = message;
        return out;
    };
    auto info = store.run(id);
    if (!info.ok())
        return fail(info.error());
    auto spans = store.spans(id);
    if (!spans.ok())
        return fail(spans.error());
    const bool hasSpans = std::any_of(spans->begin(), spans->end(),
                                      [](const telemetry::SpanEvent& s) { return s.category != "counter"; });
    auto breakdowns = store.breakdowns(id);
    if (!breakdowns.ok())
        return fail(breakdowns.error());
    auto findings = store.findings(id);
    if (!findings.ok())
        return fail(findings.error());
    if (!hasSpans && breakdowns->empty() && findings->empty()) {
        out.error = tr("Run %1 (%2) has no recorded trace spans, step breakdowns or findings in %3: trace it with "
                        "“Capture next N steps” while it trains, or train with `trainstudio-cli train --trace FILE`.")
                         .arg(runId, qs(info->name), qs(store.path()));
        return out;
    }

    std::vector<Step> steps;
    for (const auto& b : *breakdowns) {
        // The trainer stamps a breakdown at the end of its step.
        const int64_t end = b.stamp.wallTimeUs;
        steps.push_back({b.stamp.step, end - static_cast<int64_t>(std::llround(b.stepSeconds * 1e6)), end, b});
    }
    std::vector<telemetry::FindingEvent> found = std::move(*findings);
    if (hasSpans && (steps.empty() || found.empty())) {
        // Not recorded with the run (an older run, or advisor off): derive them from the spans.
        telemetry::Trace trace;
        trace.source = info->name;
        trace.format = "trainstudio";
        trace.spans = *spans;
        auto summary = telemetry::summariseTrace(trace);
        if (summary.ok()) {
            if (steps.empty())
                for (const auto& b : summary->steps)
                    steps.push_back({b.stamp.step, b.stamp.wallTimeUs,
                                     b.stamp.wallTimeUs + static_cast<int64_t>(std::llround(b.stepSeconds * 1e6)), b});
            if (found.empty())
                found = std::move(summary->findings);
        }
    }
    out.description = tr("run %1 (%2)").arg(qs(info->name), runId);
    out.steps = std::move(steps);
    out.findings = std::move(found);
    out.data = std::make_shared<const TimelineData>(std::move(*spans), "trainstudio");
    return out;
}

bool ProfilerPanel::openRun(store::RunStore& store, const QString& runId, QString* error)
{
    return showNow(prepareStoredRun(store, runId), error);
}

void ProfilerPanel::openRunInBackground(const QString& databasePath, const QString& runId)
{
    // Its own read-only connection: the store's readers never block its writer (WAL).
    const std::string path = databasePath.toStdString();
    startBackgroundLoad(runId, tr("run %1").arg(runId.left(8)), [path, runId] {
        auto store = store::RunStore::open(path, {.readOnly = true});
        if (!store.ok()) {
            PreparedTrace failed;
            failed.error = qs(store.error().toString());
            return failed;
        }
        return prepareStoredRun(*store, runId);
    });
}

void ProfilerPanel::clear()
{
    load({}, {}, {}, {}, {});
}

void ProfilerPanel::load(std::vector<telemetry::SpanEvent> spans, const std::string& format, const QString& description,
                         std::vector<Step> steps, std::vector<telemetry::FindingEvent> findings)
{
    m_data = std::make_shared<const TimelineData>(std::move(spans), format);
    m_description = description;
    m_steps = std::move(steps);
    std::stable_sort(m_steps.begin(), m_steps.end(), [](const Step& a, const Step& b) { return a.step < b.step; });
    m_findings = std::move(findings);
    showLoaded();
}

void ProfilerPanel::showLoaded()
{
    m_rangeStats = RangeStats{};
    m_timeline->setData(m_data);
    if (m_data->empty() && m_description.isEmpty()) {
        m_info->setText(tr("No trace loaded: open a Chrome trace file, or open a run from the history."));
    } else if (m_data->empty()) {
        m_info->setText(tr("%1 — no trace spans recorded (use “Capture next N steps” while it trains); %n step "
                           "breakdown(s) and the findings are below.", nullptr, static_cast<int>(m_steps.size()))
                            .arg(m_description));
    } else {
        m_info->setText(tr("%1 — %n span(s)", nullptr, static_cast<int>(m_data->spans().size())).arg(m_description) +
                        tr(", %n lane(s), ", nullptr, static_cast<int>(m_data->lanes().size())) +
                        formatMicros(static_cast<double>(m_data->endUs() - m_data->startUs())) +
                        (m_steps.empty() ? tr(", no step markers") : tr(", %n step(s)", nullptr, static_cast<int>(m_steps.size()))));
    }
    // The colour key: the trace's categories, those with the most spans first.
    std::vector<std::pair<int64_t, std::size_t>> counts(m_data->categories().size());
    for (std::size_t c = 0; c < counts.size(); ++c)
        counts[c].second = c;
    for (std::size_t i = 0; i < m_data->spans().size(); ++i)
        --counts[static_cast<std::size_t>(m_data->categoryIdOf(static_cast<int>(i)))].first;
    std::sort(counts.begin(), counts.end());
    QStringList keys;
    for (const auto& [negCount, c] : counts)
        keys << QStringLiteral("<span style='color:%1'>&#9632;</span>&nbsp;%2")
                    .arg(timelineCategoryColor(m_data->categories()[c]).name(), qs(m_data->categories()[c]).toHtmlEscaped());
    m_legend->setText(keys.join(QStringLiteral(" &nbsp; ")));
    m_legend->setVisible(!keys.isEmpty());
    showSpanDetails(-1);
    m_categoryView->clear();
    m_topView->clear();
    m_rangeLabel->setText(tr("Shift+drag on the timeline to select a time range."));
    fillStepPlot();
    fillFindings();
    Q_EMIT traceLoaded(m_description);
}

void ProfilerPanel::showSpanDetails(int span)
{
    if (!m_data || span < 0 || static_cast<std::size_t>(span) >= m_data->spans().size()) {
        m_details->setHtml(tr("<p>Click a span on the timeline to see its details.</p>"));
        return;
    }
    const telemetry::SpanEvent& s = m_data->spans()[static_cast<std::size_t>(span)];
    QString html = QStringLiteral("<h3>%1</h3><table cellspacing='4'>").arg(qs(s.name).toHtmlEscaped());
    auto row = [&html](const QString& key, const QString& value) {
        html += QStringLiteral("<tr><td><b>%1</b></td><td>%2</td></tr>").arg(key, value.toHtmlEscaped());
    };
    row(tr("Category"), qs(m_data->categoryOf(span)) + (s.category.empty() ? tr(" (by name)") : QString()));
    row(tr("Lane"), qs(telemetry::laneLabel(s.stamp.lane)));
    row(tr("Start"), tr("+%1 from the trace start").arg(formatMicros(static_cast<double>(s.startUs - m_data->startUs()))));
    row(tr("Duration"), formatMicros(static_cast<double>(s.durationUs)));
    row(tr("Self time"), formatMicros(static_cast<double>(m_data->selfUs(span))));
    if (s.stamp.step > 0)
        row(tr("Step"), QString::number(s.stamp.step));
    const int parent = m_data->parentOf(span);
    if (parent >= 0)
        row(tr("Inside"), qs(m_data->spans()[static_cast<std::size_t>(parent)].name));
    for (const auto& [key, value] : s.args)
        row(qs(key), qs(value));
    html += QStringLiteral("</table>");
    m_details->setHtml(html);
}

void ProfilerPanel::showRangeStats(int64_t t0Us, int64_t t1Us)
{
    m_categoryView->clear();
    m_topView->clear();
    if (!m_data || m_data->empty())
        return;
    m_rangeStats = m_data->rangeStats(t0Us, t1Us);
    const RangeStats& st = m_rangeStats;
    m_rangeLabel->setText(tr("Range %1 (from +%2): %n span(s), %3 of span time over all lanes", nullptr, static_cast<int>(st.spans))
                              .arg(formatMicros(static_cast<double>(st.t1Us - st.t0Us)),
                                   formatMicros(static_cast<double>(st.t0Us - m_data->startUs())), formatMicros(st.busyUs)));
    for (const CategoryTime& c : st.byCategory) {
        auto* item = new QTreeWidgetItem(m_categoryView);
        QPixmap swatch(10, 10);
        swatch.fill(timelineCategoryColor(c.category));
        item->setIcon(0, QIcon(swatch));
        item->setText(0, qs(c.category));
        item->setText(1, formatMicros(c.selfUs));
        item->setText(2, QStringLiteral("%1%").arg(st.busyUs > 0 ? 100.0 * c.selfUs / st.busyUs : 0.0, 0, 'f', 1));
        item->setTextAlignment(1, Qt::AlignRight);
        item->setTextAlignment(2, Qt::AlignRight);
    }
    for (const SpanNameTime& t : st.top) {
        auto* item = new QTreeWidgetItem(m_topView);
        item->setText(0, qs(t.name));
        item->setToolTip(0, qs(t.name));
        item->setText(1, qs(t.category));
        item->setText(2, QString::number(t.count));
        item->setText(3, formatMicros(t.totalUs));
        item->setText(4, formatMicros(std::max(0.0, t.selfUs)));
        for (int c = 2; c <= 4; ++c)
            item->setTextAlignment(c, Qt::AlignRight);
    }
    for (int c = 0; c < m_categoryView->columnCount(); ++c)
        m_categoryView->resizeColumnToContents(c);
}

void ProfilerPanel::fillStepPlot()
{
    m_stepPlot->clearPlottables();
    if (m_steps.empty()) {
        m_stepPlot->replot(QCustomPlot::rpQueuedReplot);
        return;
    }
    QVector<double> keys;
    for (const Step& s : m_steps)
        keys << static_cast<double>(s.step);
    QCPBars* below = nullptr;
    double top = 0;
    for (int p = 0; p < telemetry::kStepPartCount; ++p) {
        const auto part = static_cast<telemetry::StepPart>(p);
        auto* bars = new QCPBars(m_stepPlot->xAxis, m_stepPlot->yAxis);
        bars->setName(QString::fromLatin1(telemetry::stepPartName(part)));
        const QColor color = timelineCategoryColor(telemetry::stepPartName(part));
        bars->setBrush(color);
        bars->setPen(QPen(color.darker(130)));
        bars->setWidthType(QCPBars::wtPlotCoords);
        // Steps are usually 1 apart; imported traces may number them sparsely.
        bars->setWidth(m_steps.size() > 1 ? 0.8 * std::max(1.0, (keys.back() - keys.front()) / static_cast<double>(keys.size() - 1)) : 0.8);
        QVector<double> values;
        for (const Step& s : m_steps)
            values << telemetry::partSeconds(s.breakdown, part) * 1e3;
        bars->setData(keys, values, true);
        if (below)
            bars->moveAbove(below);
        below = bars;
    }
    for (const Step& s : m_steps)
        top = std::max(top, s.breakdown.stepSeconds * 1e3);
    const double pad = m_steps.size() > 1 ? (keys.back() - keys.front()) / static_cast<double>(keys.size() - 1) : 1.0;
    m_stepPlot->xAxis->setRange(keys.front() - pad, keys.back() + pad);
    m_stepPlot->yAxis->setRange(0, top * 1.1 + 1e-6);
    m_stepPlot->replot(QCustomPlot::rpQueuedReplot);
}

void ProfilerPanel::fillFindings()
{
    m_findingsView->clear();
    for (std::size_t i = 0; i < m_findings.size(); ++i) {
        const telemetry::FindingEvent& f = m_findings[i];
        auto* item = new QTreeWidgetItem(m_findingsView);
        QPixmap dot(10, 10);
        dot.fill(severityColor(f.severity));
        item->setIcon(0, QIcon(dot));
        item->setText(0, qs(f.severity));
        item->setText(1, qs(f.message) + QStringLiteral("\n→ ") + qs(f.recommendation));
        item->setToolTip(1, qs(f.kind) + QStringLiteral(": ") + qs(f.recommendation));
        item->setText(2, f.firstStep == f.lastStep ? QString::number(f.firstStep)
                                                   : QStringLiteral("%1–%2").arg(f.firstStep).arg(f.lastStep));
        item->setData(0, Qt::UserRole, static_cast<int>(i));
    }
    m_tabs->setTabText(3, m_findings.empty() ? tr("Findings") : tr("Findings (%1)").arg(m_findings.size()));
}

void ProfilerPanel::selectFinding(int index)
{
    if (!m_data || m_data->empty() || index < 0 || static_cast<std::size_t>(index) >= m_findings.size())
        return;
    const telemetry::FindingEvent& f = m_findings[static_cast<std::size_t>(index)];
    int64_t t0 = m_data->endUs(), t1 = m_data->startUs();
    std::vector<const Step*> steps;
    for (const Step& s : m_steps)
        if (s.step >= f.firstStep && s.step <= f.lastStep) {
            steps.push_back(&s);
            t0 = std::min(t0, s.startUs);
            t1 = std::max(t1, s.endUs);
        }
    if (steps.empty()) {  // no step markers: the finding is about the whole trace
        t0 = m_data->startUs();
        t1 = m_data->endUs();
    }
    const std::set<int> parts = partsOfFinding(f.kind);
    std::vector<int> culprits;
    for (std::size_t row = 0; row < m_data->rows().size(); ++row) {
        const TimelineRow& r = m_data->rows()[row];
        const auto [first, last] = m_data->rowRange(static_cast<int>(row), static_cast<double>(t0), static_cast<double>(t1));
        for (std::size_t k = first; k < last; ++k) {
            if (r.ends[k] <= t0 || r.starts[k] >= t1)
                continue;  // touches the window only at its edge
            const int span = r.spans[k];
            const telemetry::SpanEvent& s = m_data->spans()[static_cast<std::size_t>(span)];
            if (!parts.empty()) {
                if (parts.count(telemetry::classifySpan(s, m_data->format())))
                    culprits.push_back(span);
            } else {
                for (const Step* st : steps)
                    if (s.startUs == st->startUs && s.startUs + s.durationUs == st->endUs)
                        culprits.push_back(span);
            }
        }
    }
    m_timeline->setHighlightedSpans(std::move(culprits));
    const double margin = std::max(1.0, static_cast<double>(t1 - t0) * 0.03);
    m_timeline->setVisibleRange(static_cast<double>(t0) - margin, static_cast<double>(t1) + margin);
    m_timeline->setSelectedRange(t0, t1);
    m_tabs->setCurrentWidget(m_findingsView);
    if (QTreeWidgetItem* item = m_findingsView->topLevelItem(index))
        m_findingsView->setCurrentItem(item);
}

void ProfilerPanel::zoomToStep(int index)
{
    if (index < 0 || static_cast<std::size_t>(index) >= m_steps.size())
        return;
    const Step& s = m_steps[static_cast<std::size_t>(index)];
    const double margin = std::max(1.0, static_cast<double>(s.endUs - s.startUs) * 0.03);
    m_timeline->setVisibleRange(static_cast<double>(s.startUs) - margin, static_cast<double>(s.endUs) + margin);
    m_timeline->setSelectedRange(s.startUs, s.endUs);
}

void ProfilerPanel::browseForTrace()
{
    const QString path = QFileDialog::getOpenFileName(this, tr("Open Chrome Trace"), QString(),
                                                      tr("Chrome traces (*.json *.json.gz *.gz);;All files (*)"));
    if (path.isEmpty())
        return;
    m_browsedPath = path;
    openTraceFileInBackground(path);
}

} // namespace ts
