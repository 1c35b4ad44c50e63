#include "trainpage.h"

#include <QHBoxLayout>
#include <QLabel>
#include <QMessageBox>
#include <QPushButton>
#include <QScrollArea>
#include <QSpinBox>
#include <QSplitter>
#include <QVBoxLayout>

#include "dashboard/dashboardwidget.h"
#include "session/trainingsession.h"
#include "setup/runsetuppanel.h"

namespace ts {

TrainPage::TrainPage(TrainingSession* session, QWidget* parent)
    : QWidget(parent), m_session(session), m_setup(new RunSetupPanel), m_dashboard(new DashboardWidget)
{
    setObjectName(QStringLiteral("trainPage"));
    m_train = new QPushButton(tr("Train"));
    m_train->setObjectName(QStringLiteral("trainButton"));
    m_train->setDefault(true);
    m_pause = new QPushButton(tr("Pause"));
    m_pause->setObjectName(QStringLiteral("pauseButton"));
    m_stop = new QPushButton(tr("Stop"));
    m_stop->setObjectName(QStringLiteral("stopButton"));
    m_captureSteps = new QSpinBox;
    m_captureSteps->setRange(1, 100000);
    m_captureSteps->setValue(20);
    m_captureSteps->setSuffix(tr(" steps"));
    m_capture = new QPushButton(tr("Capture trace"));
    m_capture->setObjectName(QStringLiteral("captureButton"));
    m_capture->setToolTip(tr("Trace the next N steps of the running run and open them in the Profiler"));
    m_live = new QPushButton(tr("Show live run"));
    m_live->setVisible(false);
    m_status = new QLabel(tr("Ready"));
    m_status->setObjectName(QStringLiteral("sessionStatus"));
    m_status->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);  // long reasons must not widen the window
    m_title = new QLabel;
    QFont tf = m_title->font();
    tf.setBold(true);
    m_title->setFont(tf);

    auto* bar = new QHBoxLayout;
    bar->addWidget(m_train);
    bar->addWidget(m_pause);
    bar->addWidget(m_stop);
    bar->addSpacing(16);
    bar->addWidget(m_captureSteps);
    bar->addWidget(m_capture);
    bar->addSpacing(16);
    bar->addWidget(m_title);
    bar->addWidget(m_status, 1);
    bar->addWidget(m_live);

    auto* scroll = new QScrollArea;
    scroll->setWidget(m_setup);
    scroll->setWidgetResizable(true);
    scroll->setMinimumWidth(300);
    scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
    auto* split = new QSplitter(Qt::Horizontal);
    split->addWidget(scroll);
    // Small windows scroll the dashboards rather than growing the window.
    auto* dashScroll = new QScrollArea;
    dashScroll->setWidget(m_dashboard);
    dashScroll->setWidgetResizable(true);
    dashScroll->setFrameShape(QFrame::NoFrame);
    m_dashboard->setMinimumSize(640, 560);
    split->addWidget(dashScroll);
    split->setStretchFactor(1, 1);
    split->setSizes({400, 1000});

    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);
    layout->addLayout(bar);
    layout->addWidget(split, 1);

    m_dashboard->setData(&m_session->data());

    connect(m_train, &QPushButton::clicked, this, [this] { startTraining(); });
    connect(m_pause, &QPushButton::clicked, this, [this] {
        if (m_session->state() == TrainingSession::State::Paused) m_session->resume();
        else m_session->pause();
        updateControls();
    });
    connect(m_stop, &QPushButton::clicked, this, [this] { m_session->stop(); });
    connect(m_capture, &QPushButton::clicked, this, [this] {
        QString error;
        if (!m_session->captureTrace(m_captureSteps->value(), &error)) m_status->setText(tr("Capture: %1").arg(error));
        else m_status->setText(tr("Capturing %1 steps…").arg(m_captureSteps->value()));
        updateControls();
    });
    connect(m_live, &QPushButton::clicked, this, &TrainPage::showLiveRun);
    connect(m_setup, &RunSetupPanel::changed, this, &TrainPage::updateControls);
    connect(m_session, &TrainingSession::updated, this, [this] {
        if (!m_showingRecorded) m_dashboard->refresh();
    });
    connect(m_session, &TrainingSession::stateChanged, this, [this](TrainingSession::State) { updateControls(); });
    connect(m_session, &TrainingSession::runStarted, this, [this](const QString& id) {
        m_title->setText(tr("Run %1").arg(id.left(8)));
    });
    connect(m_session, &TrainingSession::captureFinished, this, [this](const QString& id) {
        m_status->setText(tr("Trace captured: see the Profiler"));
        Q_EMIT captureReady(id);
    });
    connect(m_session, &TrainingSession::finished, this, [this](TrainingSession::State s, const QString& message) {
        if (!m_showingRecorded) m_dashboard->refresh();
        updateControls();
        if (s == TrainingSession::State::Failed) m_status->setText(tr("Failed: %1").arg(message));
        Q_EMIT runFinished(m_session->runId());
    });
    updateControls();
}

void TrainPage::setModel(const ModelSpec& model, const QString& blockedReason)
{
    m_blocked = blockedReason;
    m_setup->setModel(model);
    updateControls();
}

bool TrainPage::startTraining(QString* error)
{
    QString why = m_blocked;
    if (why.isEmpty()) {
        const QStringList problems = m_setup->problems();
        if (!problems.isEmpty()) why = problems.join('\n');
    }
    if (why.isEmpty()) {
        showLiveRun();
        if (m_session->start(m_setup->config(), QString(), &why, m_setup->remoteSettings())) {
            m_dashboard->setData(&m_session->data());
            m_dashboard->setFollow(true);
            updateControls();
            return true;
        }
    }
    m_status->setText(tr("Cannot train: %1").arg(why.section('\n', 0, 0)));
    m_status->setToolTip(why);
    if (error) *error = why;
    return false;
}

void TrainPage::showRecordedRun(RunData data, const QString& title)
{
    m_recorded = std::move(data);
    m_showingRecorded = true;
    m_dashboard->setData(&m_recorded);
    m_dashboard->setFollow(true);
    m_title->setText(title);
    m_live->setVisible(true);
    updateControls();
}

void TrainPage::showLiveRun()
{
    if (!m_showingRecorded) return;
    m_showingRecorded = false;
    m_dashboard->setData(&m_session->data());
    m_title->setText(m_session->runId().isEmpty() ? QString() : tr("Run %1").arg(m_session->runId().left(8)));
    m_live->setVisible(false);
    m_recorded.clear();
}

void TrainPage::updateControls()
{
    using S = TrainingSession::State;
    const S s = m_session->state();
    const bool active = m_session->isActive();
    const QStringList problems = m_setup->problems();
    m_train->setEnabled(!active && m_blocked.isEmpty() && problems.isEmpty());
    m_train->setToolTip(!m_blocked.isEmpty() ? m_blocked : problems.join('\n'));
    m_pause->setEnabled((s == S::Running || s == S::Paused) && !m_session->isRemote());
    m_pause->setToolTip(m_session->isRemote() && active ? tr("Pause is not available for runs on remote workers") : QString());
    m_pause->setText(s == S::Paused ? tr("Resume") : tr("Pause"));
    m_stop->setEnabled(active && s != S::Stopping);
    m_capture->setEnabled((s == S::Running || s == S::Paused) && m_session->captureUntilStep() == 0);
    m_setup->setEnabled(!active);
    QString text = TrainingSession::stateName(s);
    if (s == S::Failed) text = tr("Failed: %1").arg(m_session->errorMessage().section('\n', 0, 0));
    else if (!active && !m_blocked.isEmpty()) text = tr("Cannot train: %1").arg(m_blocked);
    else if (!active && !problems.isEmpty()) text = tr("Cannot train: %1").arg(problems.first());
    if (!m_status->text().startsWith(tr("Capturing")) || !active) m_status->setText(text);
}

} // namespace ts
