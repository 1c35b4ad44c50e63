#include "mainwindow.h"

#include <QActionGroup>
#include <QApplication>
#include <QClipboard>
#include <QCloseEvent>
#include <QDir>
#include <QDockWidget>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QLabel>
#include <QLineEdit>
#include <QListView>
#include <QMenu>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QSaveFile>
#include <QSettings>
#include <QStatusBar>
#include <QStyle>
#include <QTabWidget>
#include <QTimer>
#include <QToolBar>
#include <QUndoStack>
#include <QUndoView>

#include "designer/designerscene.h"
#include "designer/designerview.h"
#include "designer/format.h"
#include "designer/inspector.h"
#include "designer/kerasscript.h"
#include "designer/modeldocument.h"
#include "designer/palettewidget.h"
#include "designer/theme.h"
#include "models/problemsmodel.h"
#include "profiler/profilerpanel.h"
#include "runs/runhistorypanel.h"
#include "session/trainingsession.h"
#include "store/run_store.h"
#include "setup/runsetuppanel.h"
#include "trainpage.h"

namespace ts {

namespace {

constexpr const char* kLayersMimeType = "application/x-trainstudio-layers";
constexpr int kMaxRecent = 8;

bool writeText(const QString& path, const QByteArray& text, QString* error)
{
    QSaveFile f(path);
    if (!f.open(QIODevice::WriteOnly) || f.write(text) != text.size() || !f.commit()) {
        if (error)
            *error = QObject::tr("%1: cannot write: %2").arg(path, f.errorString());
        return false;
    }
    return true;
}

QString errorText(const Error& e)
{
    return e.hint.empty() ? toQString(e.message)
                          : toQString(e.message) + QStringLiteral("\n\nHint: ") + toQString(e.hint);
}

} // namespace

MainWindow::MainWindow(QWidget* parent)
    : QMainWindow(parent), m_doc(new ModelDocument(this)), m_scene(new DesignerScene(m_doc, this)),
      m_view(new DesignerView(m_scene, this)), m_palette(new PaletteWidget(this)),
      m_inspector(new Inspector(m_doc, this)), m_problems(new ProblemsModel(m_doc, this))
{
    setObjectName(QStringLiteral("mainWindow"));
    setWindowIcon(appIcon());
    setAcceptDrops(true);
    setDockOptions(AnimatedDocks | AllowTabbedDocks);
    m_view->setObjectName(QStringLiteral("designerView"));
    m_session = new TrainingSession(this);
    m_trainPage = new TrainPage(m_session, this);
    m_tabs = new QTabWidget(this);
    m_tabs->setObjectName(QStringLiteral("mainTabs"));
    m_tabs->setDocumentMode(true);
    m_tabs->addTab(m_view, tr("Design"));
    m_tabs->addTab(m_trainPage, tr("Train"));
    m_profiler = new ProfilerPanel(this);
    m_profiler->setProperty("tabName", QStringLiteral("profiler"));
    m_tabs->addTab(m_profiler, tr("Profiler"));
    m_runs = new RunHistoryPanel(this);
    m_runs->setProperty("tabName", QStringLiteral("runs"));
    m_tabs->addTab(m_runs, tr("Runs"));
    setCentralWidget(m_tabs);
    // A capture asked for in the profiler traces the running run; when the spans are in the
    // store, the profiler shows them.
    m_profiler->setCaptureEnabled(false);
    connect(m_profiler, &ProfilerPanel::captureRequested, this, [this](int steps) {
        QString error;
        if (!m_session->captureTrace(steps, &error)) statusBar()->showMessage(tr("Capture: %1").arg(error), 8000);
        else statusBar()->showMessage(tr("Capturing the next %1 steps…").arg(steps), 8000);
    });
    connect(m_trainPage, &TrainPage::captureReady, this, [this](const QString& runId) {
        QString error;
        if (!m_runs->store() || !m_profiler->openRun(*m_runs->store(), runId, &error))
            statusBar()->showMessage(tr("Profiler: %1").arg(error), 8000);
    });
    connect(m_profiler, &ProfilerPanel::loadFailed, this, [this](const QString&, const QString& error) {
        statusBar()->showMessage(tr("Profiler: %1").arg(error), 8000);
    });
    connect(m_session, &TrainingSession::stateChanged, this, [this](TrainingSession::State s) {
        m_profiler->setCaptureEnabled(s == TrainingSession::State::Running || s == TrainingSession::State::Paused);
    });
    connect(m_session, &TrainingSession::runStarted, m_runs, &RunHistoryPanel::refresh);
    connect(m_trainPage, &TrainPage::runFinished, m_runs, &RunHistoryPanel::refresh);
    connect(m_runs, &RunHistoryPanel::startFromWeightsRequested, this, [this](const QString& runId, const QString& path) {
        m_trainPage->setup()->setInitialWeights(path);
        showTab(QStringLiteral("train"));
        statusBar()->showMessage(tr("The next run starts from the weights of run %1").arg(runId.left(8)), 8000);
    });
    connect(m_runs, &RunHistoryPanel::openRunRequested, this, [this](const QString& runId) {
        QString error;
        if (!openRecordedRun(runId, &error)) showError(tr("Open run"), error);
    });
    setDatabasePath(m_session->databasePath());

    createActions();
    createMenus();
    createDocks();

    m_totalsLabel = new QLabel(this);
    m_totalsLabel->setObjectName(QStringLiteral("totalsLabel"));
    m_stateLabel = new QLabel(this);
    m_stateLabel->setObjectName(QStringLiteral("trainStateLabel"));
    m_zoomLabel = new QLabel(this);
    m_zoomLabel->setObjectName(QStringLiteral("zoomLabel"));
    m_zoomLabel->setMinimumWidth(QFontMetrics(font()).horizontalAdvance(QStringLiteral("400 %")) + 8);
    m_zoomLabel->setAlignment(Qt::AlignRight | Qt::AlignVCenter);
    statusBar()->addPermanentWidget(m_stateLabel, 0);
    statusBar()->addPermanentWidget(m_totalsLabel, 0);
    statusBar()->addPermanentWidget(m_zoomLabel, 0);

    connect(m_doc, &ModelDocument::analysisUpdated, this, &MainWindow::updateAnalysisState);
    connect(m_doc, &ModelDocument::modifiedChanged, this, &MainWindow::updateTitle);
    connect(m_doc, &ModelDocument::filePathChanged, this, &MainWindow::updateTitle);
    connect(m_doc, &ModelDocument::headerChanged, this, &MainWindow::updateTitle);
    connect(m_doc, &ModelDocument::modelReset, this, [this] {
        m_pasteCount = 0;
        updateTitle();
        // Let the items get their final size (annotations) before fitting.
        QTimer::singleShot(0, m_view, &DesignerView::fitToView);
    });
    connect(m_scene, &QGraphicsScene::selectionChanged, this, [this] {
        m_inspector->setSelection(m_scene->selectedIds());
        updateSelectionActions();
    });
    connect(m_scene, &DesignerScene::message, this,
            [this](const QString& m) { statusBar()->showMessage(m, 6000); });
    connect(m_inspector, &Inspector::message, this,
            [this](const QString& m) { statusBar()->showMessage(m, 6000); });
    connect(m_scene, &DesignerScene::nodeActivated, this, [this](const std::string&) {
        if (auto* dock = findChild<QDockWidget*>(QStringLiteral("inspectorDock"))) {
            dock->show();
            dock->raise();
        }
        if (QWidget* w = m_inspector->findChild<QWidget*>(QStringLiteral("layerName")))
            w->setFocus();
    });
    connect(m_view, &DesignerView::layerDropped, this,
            [this](const QString& type, QPointF pos) { addLayerAt(type, pos); });
    connect(m_view, &DesignerView::zoomChanged, this,
            [this](double z) { m_zoomLabel->setText(QStringLiteral("%1 %").arg(qRound(z * 100))); });
    connect(m_palette, &PaletteWidget::layerActivated, this,
            [this](const QString& type) { addLayerFromPalette(type); });

    restoreSettings();
    updateTitle();
    updateAnalysisState();
    updateSelectionActions();
    m_zoomLabel->setText(QStringLiteral("%1 %").arg(qRound(m_view->zoom() * 100)));
}

MainWindow::~MainWindow()
{
    // The views go before the document they show (it is the first child, so Qt would delete
    // it first); the scene's last selection change must not reach a half-destroyed window.
    m_scene->blockSignals(true);
    delete m_view;
    delete m_scene;
}

// ---- actions and menus ------------------------------------------------------------------------

QAction* MainWindow::makeAction(const QString& name, const QString& text, const QKeySequence& shortcut,
                                const QString& tip)
{
    auto* a = new QAction(text, this);
    a->setObjectName(name);
    if (!shortcut.isEmpty())
        a->setShortcut(shortcut);
    if (!tip.isEmpty()) {
        a->setStatusTip(tip);
        a->setToolTip(shortcut.isEmpty() ? tip
                                         : QStringLiteral("%1 (%2)").arg(tip, shortcut.toString(QKeySequence::NativeText)));
    }
    m_actions.push_back(a);
    return a;
}

QAction* MainWindow::action(const QString& name) const
{
    for (QAction* a : m_actions)
        if (a->objectName() == name)
            return a;
    return nullptr;
}

void MainWindow::createActions()
{
    QStyle* s = style();
    connect(makeAction(QStringLiteral("new"), tr("&New"), QKeySequence::New, tr("Start an empty model")),
            &QAction::triggered, this, [this] {
                if (maybeSave())
                    newFromTemplate(QString());
            });
    action(QStringLiteral("new"))->setIcon(s->standardIcon(QStyle::SP_FileIcon));
    connect(makeAction(QStringLiteral("open"), tr("&Open…"), QKeySequence::Open,
                       tr("Open a TrainStudio model or a Keras model.to_json() file")),
            &QAction::triggered, this, &MainWindow::openInteractive);
    action(QStringLiteral("open"))->setIcon(s->standardIcon(QStyle::SP_DialogOpenButton));
    connect(makeAction(QStringLiteral("save"), tr("&Save"), QKeySequence::Save, tr("Save the model")),
            &QAction::triggered, this, [this] { saveInteractive(false); });
    action(QStringLiteral("save"))->setIcon(s->standardIcon(QStyle::SP_DialogSaveButton));
    connect(makeAction(QStringLiteral("saveAs"), tr("Save &As…"), QKeySequence::SaveAs,
                       tr("Save the model under a new name")),
            &QAction::triggered, this, [this] { saveInteractive(true); });
    connect(makeAction(QStringLiteral("importKeras"), tr("&Import Keras JSON…"), QKeySequence(tr("Ctrl+I")),
                       tr("Import a Keras model.to_json() file (Sequential or Functional)")),
            &QAction::triggered, this, &MainWindow::importKerasInteractive);
    connect(makeAction(QStringLiteral("exportKerasJson"), tr("Export &Keras JSON…"), QKeySequence(tr("Ctrl+E")),
                       tr("Write the model as Keras model.to_json() (model_from_json reads it)")),
            &QAction::triggered, this, &MainWindow::exportKerasJsonInteractive);
    connect(makeAction(QStringLiteral("exportKerasScript"), tr("Export Keras &Python Script…"),
                       QKeySequence(tr("Ctrl+Shift+E")),
                       tr("Write a runnable tf.keras script that builds and trains this model")),
            &QAction::triggered, this, &MainWindow::exportKerasScriptInteractive);
    connect(makeAction(QStringLiteral("quit"), tr("&Quit"), QKeySequence::Quit, tr("Quit TrainStudio")),
            &QAction::triggered, this, &QWidget::close);
    action(QStringLiteral("quit"))->setMenuRole(QAction::QuitRole);

    QAction* undo = m_doc->undoStack()->createUndoAction(this, tr("&Undo"));
    undo->setObjectName(QStringLiteral("undo"));
    undo->setShortcut(QKeySequence::Undo);
    undo->setIcon(s->standardIcon(QStyle::SP_ArrowBack));
    m_actions.push_back(undo);
    QAction* redo = m_doc->undoStack()->createRedoAction(this, tr("&Redo"));
    redo->setObjectName(QStringLiteral("redo"));
    redo->setShortcut(QKeySequence::Redo);
    redo->setIcon(s->standardIcon(QStyle::SP_ArrowForward));
    m_actions.push_back(redo);

    // Editing the canvas: active while the canvas has focus, so text fields keep their keys.
    auto canvasAction = [this](const QString& name, const QString& text, const QKeySequence& key,
                               const QString& tip, void (MainWindow::*slot)()) {
        QAction* a = makeAction(name, text, key, tip);
        a->setShortcutContext(Qt::WidgetWithChildrenShortcut);
        m_view->addAction(a);
        connect(a, &QAction::triggered, this, slot);
        return a;
    };
    canvasAction(QStringLiteral("cut"), tr("Cu&t"), QKeySequence::Cut, tr("Cut the selected layers"),
                 &MainWindow::cutSelection);
    canvasAction(QStringLiteral("copy"), tr("&Copy"), QKeySequence::Copy, tr("Copy the selected layers"),
                 &MainWindow::copySelection);
    canvasAction(QStringLiteral("paste"), tr("&Paste"), QKeySequence::Paste, tr("Paste layers"),
                 &MainWindow::paste);
    canvasAction(QStringLiteral("duplicate"), tr("D&uplicate"), QKeySequence(tr("Ctrl+D")),
                 tr("Duplicate the selected layers"), &MainWindow::duplicateSelection);
    QAction* del = canvasAction(QStringLiteral("delete"), tr("&Delete"), QKeySequence::Delete,
                                tr("Delete the selected layers and connections"), &MainWindow::deleteSelection);
    del->setShortcuts({QKeySequence(QKeySequence::Delete), QKeySequence(Qt::Key_Backspace)});
    canvasAction(QStringLiteral("selectAll"), tr("Select &All"), QKeySequence::SelectAll,
                 tr("Select every layer"), &MainWindow::selectAll);
    connect(makeAction(QStringLiteral("find"), tr("&Find Layer Type"), QKeySequence::Find,
                       tr("Search the layer palette")),
            &QAction::triggered, this, [this] {
                if (auto* dock = findChild<QDockWidget*>(QStringLiteral("paletteDock")))
                    dock->show();
                m_palette->searchField()->setFocus();
                m_palette->searchField()->selectAll();
            });

    connect(makeAction(QStringLiteral("zoomIn"), tr("Zoom &In"), QKeySequence::ZoomIn, tr("Zoom in")),
            &QAction::triggered, m_view, &DesignerView::zoomIn);
    connect(makeAction(QStringLiteral("zoomOut"), tr("Zoom &Out"), QKeySequence::ZoomOut, tr("Zoom out")),
            &QAction::triggered, m_view, &DesignerView::zoomOut);
    connect(makeAction(QStringLiteral("resetZoom"), tr("&Actual Size"), QKeySequence(tr("Ctrl+0")),
                       tr("Zoom to 100 %")),
            &QAction::triggered, m_view, &DesignerView::resetZoom);
    connect(makeAction(QStringLiteral("fitToView"), tr("&Fit to View"), QKeySequence(tr("Ctrl+1")),
                       tr("Show the whole model")),
            &QAction::triggered, m_view, &DesignerView::fitToView);
    action(QStringLiteral("fitToView"))->setIcon(s->standardIcon(QStyle::SP_TitleBarMaxButton));
    connect(makeAction(QStringLiteral("autoLayout"), tr("Auto-&Layout"), QKeySequence(tr("Ctrl+L")),
                       tr("Arrange the layers top to bottom")),
            &QAction::triggered, this, [this] {
                if (m_doc->autoLayout())
                    QTimer::singleShot(0, m_view, &DesignerView::fitToView);
            });
    action(QStringLiteral("autoLayout"))->setIcon(s->standardIcon(QStyle::SP_FileDialogListView));

    QAction* trainAction = makeAction(QStringLiteral("train"), tr("&Train"), QKeySequence(tr("Ctrl+R")),
                                      tr("Train this model"));
    trainAction->setIcon(s->standardIcon(QStyle::SP_MediaPlay));
    connect(trainAction, &QAction::triggered, this, &MainWindow::train);

    connect(makeAction(QStringLiteral("about"), tr("&About TrainStudio")), &QAction::triggered, this, [this] {
        QMessageBox::about(this, tr("About TrainStudio"),
                           tr("<h3>TrainStudio %1</h3><p>Design neural networks by pointing and clicking, "
                              "train them with a native C++ engine, and watch them learn.</p>")
                               .arg(QApplication::applicationVersion()));
    });
    action(QStringLiteral("about"))->setMenuRole(QAction::AboutRole);
}

void MainWindow::createMenus()
{
    QMenu* file = menuBar()->addMenu(tr("&File"));
    file->addAction(action(QStringLiteral("new")));
    QMenu* templates = file->addMenu(tr("New from &Template"));
    templates->setObjectName(QStringLiteral("templatesMenu"));
    for (const QString& name : templateNames()) {
        QAction* a = templates->addAction(templateTitle(name));
        a->setObjectName(QStringLiteral("template_") + name);
        connect(a, &QAction::triggered, this, [this, name] {
            if (maybeSave())
                newFromTemplate(name);
        });
    }
    file->addAction(action(QStringLiteral("open")));
    m_recentMenu = file->addMenu(tr("Open &Recent"));
    m_recentMenu->setObjectName(QStringLiteral("recentMenu"));
    connect(m_recentMenu, &QMenu::aboutToShow, this, &MainWindow::rebuildRecentMenu);
    file->addSeparator();
    file->addAction(action(QStringLiteral("save")));
    file->addAction(action(QStringLiteral("saveAs")));
    file->addSeparator();
    file->addAction(action(QStringLiteral("importKeras")));
    file->addAction(action(QStringLiteral("exportKerasJson")));
    file->addAction(action(QStringLiteral("exportKerasScript")));
    file->addSeparator();
    file->addAction(action(QStringLiteral("quit")));

    QMenu* edit = menuBar()->addMenu(tr("&Edit"));
    for (const char* name : {"undo", "redo", "", "cut", "copy", "paste", "duplicate", "delete", "",
                             "selectAll", "find"}) {
        if (!*name)
            edit->addSeparator();
        else
            edit->addAction(action(QLatin1String(name)));
    }

    QMenu* viewMenu = menuBar()->addMenu(tr("&View"));
    viewMenu->setObjectName(QStringLiteral("viewMenu"));
    for (const char* name : {"zoomIn", "zoomOut", "resetZoom", "fitToView"})
        viewMenu->addAction(action(QLatin1String(name)));
    viewMenu->addSeparator();
    QMenu* theme = viewMenu->addMenu(tr("&Theme"));
    m_themeGroup = new QActionGroup(this);
    for (const auto& [mode, text] : {std::pair{"system", tr("Follow the &System")},
                                     std::pair{"light", tr("&Light")}, std::pair{"dark", tr("&Dark")}}) {
        QAction* a = theme->addAction(text);
        a->setObjectName(QStringLiteral("theme_") + QLatin1String(mode));
        a->setCheckable(true);
        a->setData(QLatin1String(mode));
        m_themeGroup->addAction(a);
        connect(a, &QAction::triggered, this, [this, m = QString::fromLatin1(mode)] { setTheme(m); });
    }
    viewMenu->addSeparator();

    QMenu* model = menuBar()->addMenu(tr("&Model"));
    model->addAction(action(QStringLiteral("autoLayout")));
    model->addSeparator();
    model->addAction(action(QStringLiteral("train")));

    QMenu* help = menuBar()->addMenu(tr("&Help"));
    help->addAction(action(QStringLiteral("about")));

    QToolBar* bar = addToolBar(tr("Main"));
    bar->setObjectName(QStringLiteral("mainToolBar"));
    bar->setToolButtonStyle(Qt::ToolButtonTextBesideIcon);
    bar->setMovable(false);
    for (const char* name : {"new", "open", "save", "", "undo", "redo", "", "fitToView", "autoLayout", ""}) {
        if (!*name)
            bar->addSeparator();
        else
            bar->addAction(action(QLatin1String(name)));
    }
    auto* spacer = new QWidget(bar);
    spacer->setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Preferred);
    bar->addWidget(spacer);
    bar->addAction(action(QStringLiteral("train")));
}

void MainWindow::createDocks()
{
    auto dock = [this](const QString& name, const QString& title, QWidget* w, Qt::DockWidgetArea area) {
        auto* d = new QDockWidget(title, this);
        d->setObjectName(name);
        d->setWidget(w);
        d->setFeatures(QDockWidget::DockWidgetClosable | QDockWidget::DockWidgetMovable
                       | QDockWidget::DockWidgetFloatable);
        addDockWidget(area, d);
        if (auto* menu = findChild<QMenu*>(QStringLiteral("viewMenu")))
            menu->addAction(d->toggleViewAction());
        return d;
    };
    QDockWidget* palette = dock(QStringLiteral("paletteDock"), tr("Layers"), m_palette, Qt::LeftDockWidgetArea);
    QDockWidget* inspector = dock(QStringLiteral("inspectorDock"), tr("Inspector"), m_inspector, Qt::RightDockWidgetArea);

    m_problemsView = new QListView(this);
    m_problemsView->setObjectName(QStringLiteral("problemsView"));
    m_problemsView->setModel(m_problems);
    m_problemsView->setWordWrap(true);
    m_problemsView->setUniformItemSizes(false);
    connect(m_problemsView, &QListView::activated, this, [this](const QModelIndex& i) {
        const std::string id = toStdString(i.data(ProblemsModel::NodeIdRole).toString());
        if (!id.empty() && m_scene->node(id)) {
            m_scene->selectIds({id});
            m_view->centerOnNode(id);
        }
    });
    QDockWidget* problems = dock(QStringLiteral("problemsDock"), tr("Problems"), m_problemsView, Qt::BottomDockWidgetArea);

    m_history = new QUndoView(m_doc->undoStack(), this);
    m_history->setObjectName(QStringLiteral("historyView"));
    m_history->setEmptyLabel(tr("<opened>"));
    QDockWidget* history = dock(QStringLiteral("historyDock"), tr("History"), m_history, Qt::BottomDockWidgetArea);
    tabifyDockWidget(problems, history);
    problems->raise();

    m_designDocks = {palette, inspector, problems, history};
    connect(m_tabs, &QTabWidget::currentChanged, this, &MainWindow::onTabChanged);
    resizeDocks({palette, inspector}, {250, 310}, Qt::Horizontal);
    resizeDocks({problems}, {120}, Qt::Vertical);
}

void MainWindow::restoreSettings()
{
    QSettings settings;
    const QString theme = settings.value(QStringLiteral("theme"), QStringLiteral("system")).toString();
    for (QAction* a : m_themeGroup->actions())
        a->setChecked(a->data().toString() == themeModeToString(themeModeFromString(theme)));
    if (themeModeFromString(theme) != ThemeMode::System)
        applyThemeMode(themeModeFromString(theme));
    const QByteArray geometry = settings.value(QStringLiteral("geometry")).toByteArray();
    if (!geometry.isEmpty())
        restoreGeometry(geometry);
    else
        resize(1440, 900);
    const QByteArray state = settings.value(QStringLiteral("windowState")).toByteArray();
    if (!state.isEmpty())
        restoreState(state);
}

void MainWindow::setTheme(const QString& mode)
{
    applyThemeMode(themeModeFromString(mode));
    QSettings().setValue(QStringLiteral("theme"), mode);
}

// ---- files ----------------------------------------------------------------------------------

QStringList MainWindow::templateNames()
{
    QStringList names;
    // The seed's MLP first, then the others in name order.
    for (const QString& f : QDir(QStringLiteral(":/models")).entryList({QStringLiteral("*.json")}, QDir::Files, QDir::Name))
        names << QFileInfo(f).completeBaseName();
    names.removeAll(QStringLiteral("seed_mlp"));
    if (QFile::exists(QStringLiteral(":/models/seed_mlp.json")))
        names.prepend(QStringLiteral("seed_mlp"));
    return names;
}

QString MainWindow::templateTitle(const QString& name)
{
    if (name == QLatin1String("seed_mlp"))
        return tr("MLP for Fashion-MNIST (Dense 256 → Dense 10)");
    if (name == QLatin1String("small_cnn"))
        return tr("Small CNN (2 × Conv2D + pooling)");
    if (name == QLatin1String("small_resnet"))
        return tr("Small residual network (2 residual blocks)");
    return name;
}

bool MainWindow::newFromTemplate(const QString& name)
{
    if (name.isEmpty()) {
        ModelSpec empty;
        empty.name = "untitled";
        m_doc->reset(std::move(empty));
        statusBar()->showMessage(tr("New empty model: drag layers from the palette"), 5000);
        return true;
    }
    QFile f(QStringLiteral(":/models/%1.json").arg(name));
    if (!f.open(QIODevice::ReadOnly)) {
        showError(tr("New from Template"), tr("No template named '%1'").arg(name));
        return false;
    }
    Result<ModelSpec> spec = parseModelText(f.readAll().toStdString(), toStdString(name) + ".json");
    if (!spec.ok()) {
        showError(tr("New from Template"), errorText(spec.error()));
        return false;
    }
    m_doc->reset(std::move(spec).value());
    statusBar()->showMessage(tr("New model from the template '%1'").arg(templateTitle(name)), 5000);
    return true;
}

bool MainWindow::openFile(const QString& path, QString* error)
{
    const Status s = m_doc->open(path);
    if (!s.ok()) {
        if (error)
            *error = errorText(s.error());
        else
            showError(tr("Open"), errorText(s.error()));
        return false;
    }
    if (!m_doc->importedFrom().isEmpty())
        statusBar()->showMessage(tr("Imported the Keras model %1; Save writes a TrainStudio model").arg(QFileInfo(path).fileName()), 8000);
    else
        addRecentFile(m_doc->filePath());
    rememberDirectory(path);
    return true;
}

bool MainWindow::saveFile(const QString& path, QString* error)
{
    const Status s = m_doc->save(path);
    if (!s.ok()) {
        if (error)
            *error = errorText(s.error());
        else
            showError(tr("Save"), errorText(s.error()));
        return false;
    }
    addRecentFile(m_doc->filePath());
    rememberDirectory(path);
    statusBar()->showMessage(tr("Saved %1").arg(QDir::toNativeSeparators(path)), 4000);
    return true;
}

bool MainWindow::exportKerasJson(const QString& path, QString* error)
{
    Result<nlohmann::json> j = modelToKerasJson(m_doc->spec());
    QString e;
    if (!j.ok())
        e = errorText(j.error());
    else if (writeText(path, QByteArray::fromStdString(j.value().dump(2) + "\n"), &e))
        return true;
    if (error)
        *error = e;
    else
        showError(tr("Export Keras JSON"), e);
    return false;
}

bool MainWindow::exportKerasScript(const QString& path, QString* error)
{
    Result<std::string> script = kerasScript(m_doc->spec());
    QString e;
    if (!script.ok())
        e = errorText(script.error());
    else if (writeText(path, QByteArray::fromStdString(script.value()), &e)) {
        QFile::setPermissions(path, QFile::permissions(path) | QFileDevice::ExeOwner);
        return true;
    }
    if (error)
        *error = e;
    else
        showError(tr("Export Keras Script"), e);
    return false;
}

QString MainWindow::lastDirectory() const
{
    const QString dir = QSettings().value(QStringLiteral("lastDirectory")).toString();
    if (!dir.isEmpty() && QDir(dir).exists())
        return dir;
    return QDir::homePath();
}

void MainWindow::rememberDirectory(const QString& path)
{
    QSettings().setValue(QStringLiteral("lastDirectory"), QFileInfo(path).absolutePath());
}

void MainWindow::openInteractive()
{
    if (!maybeSave())
        return;
    const QString path = QFileDialog::getOpenFileName(this, tr("Open Model"), lastDirectory(),
                                                      tr("Models (*.json);;All files (*)"));
    if (!path.isEmpty())
        openFile(path);
}

void MainWindow::importKerasInteractive()
{
    if (!maybeSave())
        return;
    const QString path = QFileDialog::getOpenFileName(this, tr("Import Keras JSON"), lastDirectory(),
                                                      tr("Keras model.to_json() (*.json);;All files (*)"));
    if (!path.isEmpty())
        openFile(path);
}

void MainWindow::exportKerasJsonInteractive()
{
    const QString path = QFileDialog::getSaveFileName(
        this, tr("Export Keras JSON"),
        QDir(lastDirectory()).filePath(toQString(m_doc->spec().name) + QStringLiteral("_keras.json")),
        tr("Keras JSON (*.json)"));
    if (!path.isEmpty() && exportKerasJson(path))
        statusBar()->showMessage(tr("Exported %1").arg(QDir::toNativeSeparators(path)), 4000);
}

void MainWindow::exportKerasScriptInteractive()
{
    const QString path = QFileDialog::getSaveFileName(
        this, tr("Export Keras Python Script"),
        QDir(lastDirectory()).filePath(toQString(pythonIdentifier(m_doc->spec().name)) + QStringLiteral(".py")),
        tr("Python (*.py)"));
    if (!path.isEmpty() && exportKerasScript(path))
        statusBar()->showMessage(tr("Exported %1: run it with python3").arg(QDir::toNativeSeparators(path)), 6000);
}

bool MainWindow::saveInteractive(bool askPath)
{
    QString path = m_doc->filePath();
    if (askPath || path.isEmpty()) {
        const QString suggested = path.isEmpty()
                                      ? QDir(lastDirectory()).filePath(toQString(m_doc->spec().name) + QStringLiteral(".json"))
                                      : path;
        path = QFileDialog::getSaveFileName(this, tr("Save Model"), suggested, tr("TrainStudio model (*.json)"));
        if (path.isEmpty())
            return false;
        if (!path.endsWith(QLatin1String(".json"), Qt::CaseInsensitive))
            path += QStringLiteral(".json");
    }
    return saveFile(path);
}

bool MainWindow::maybeSave()
{
    if (!m_doc->isModified())
        return true;
    QMessageBox box(QMessageBox::Warning, tr("Unsaved Changes"),
                    tr("The model '%1' has changes that are not saved.").arg(toQString(m_doc->spec().name)),
                    QMessageBox::Save | QMessageBox::Discard | QMessageBox::Cancel, this);
    box.setObjectName(QStringLiteral("unsavedChangesBox"));
    box.setInformativeText(tr("Save them before continuing?"));
    box.setDefaultButton(QMessageBox::Save);
    switch (box.exec()) {
    case QMessageBox::Save: return saveInteractive(false);
    case QMessageBox::Discard: return true;
    default: return false;
    }
}

QStringList MainWindow::recentFiles() const
{
    return QSettings().value(QStringLiteral("recentFiles")).toStringList();
}

void MainWindow::addRecentFile(const QString& path)
{
    if (path.isEmpty())
        return;
    QStringList files = recentFiles();
    const QString abs = QFileInfo(path).absoluteFilePath();
    files.removeAll(abs);
    files.prepend(abs);
    while (files.size() > kMaxRecent)
        files.removeLast();
    QSettings().setValue(QStringLiteral("recentFiles"), files);
}

void MainWindow::rebuildRecentMenu()
{
    m_recentMenu->clear();
    const QStringList files = recentFiles();
    int n = 0;
    for (const QString& f : files) {
        ++n;
        QAction* a = m_recentMenu->addAction(QStringLiteral("&%1 %2").arg(n).arg(QFileInfo(f).fileName()));
        a->setToolTip(QDir::toNativeSeparators(f));
        a->setStatusTip(QDir::toNativeSeparators(f));
        connect(a, &QAction::triggered, this, [this, f] {
            if (!maybeSave())
                return;
            if (!QFile::exists(f)) {
                QStringList files = recentFiles();
                files.removeAll(f);
                QSettings().setValue(QStringLiteral("recentFiles"), files);
                showError(tr("Open Recent"), tr("%1 no longer exists; removed it from the list.").arg(f));
                return;
            }
            openFile(f);
        });
    }
    if (files.isEmpty()) {
        m_recentMenu->addAction(tr("No recent files"))->setEnabled(false);
        return;
    }
    m_recentMenu->addSeparator();
    connect(m_recentMenu->addAction(tr("&Clear Menu")), &QAction::triggered, this,
            [] { QSettings().remove(QStringLiteral("recentFiles")); });
}

void MainWindow::closeEvent(QCloseEvent* event)
{
    if (m_session->isActive()) {
        if (m_confirmStop
            && QMessageBox::question(this, tr("Quit"), tr("A run is training. Stop it and quit? Everything recorded so far is kept."),
                                     QMessageBox::Yes | QMessageBox::Cancel, QMessageBox::Cancel) != QMessageBox::Yes) {
            event->ignore();
            return;
        }
        // Stopped at the next step boundary and recorded as interrupted.
        m_session->stop(true);
        m_session->waitForFinished(30000);
    }
    if (!maybeSave()) {
        event->ignore();
        return;
    }
    QSettings settings;
    settings.setValue(QStringLiteral("geometry"), saveGeometry());
    settings.setValue(QStringLiteral("windowState"), saveState());
    event->accept();
}

void MainWindow::dragEnterEvent(QDragEnterEvent* event)
{
    if (event->mimeData()->hasUrls())
        for (const QUrl& u : event->mimeData()->urls())
            if (u.isLocalFile() && u.toLocalFile().endsWith(QLatin1String(".json"), Qt::CaseInsensitive)) {
                event->acceptProposedAction();
                return;
            }
    QMainWindow::dragEnterEvent(event);
}

void MainWindow::dropEvent(QDropEvent* event)
{
    for (const QUrl& u : event->mimeData()->urls())
        if (u.isLocalFile() && u.toLocalFile().endsWith(QLatin1String(".json"), Qt::CaseInsensitive)) {
            event->acceptProposedAction();
            const QString path = u.toLocalFile();
            QTimer::singleShot(0, this, [this, path] {
                if (maybeSave())
                    openFile(path);
            });
            return;
        }
    QMainWindow::dropEvent(event);
}

// ---- editing -------------------------------------------------------------------------------

std::string MainWindow::addLayerAt(const QString& type, QPointF pos)
{
    const std::string id = m_doc->addLayer(toStdString(type), pos);
    if (!id.empty()) {
        m_scene->selectIds({id});
        m_view->setFocus();
    }
    return id;
}

std::string MainWindow::addLayerFromPalette(const QString& type)
{
    const std::vector<std::string> selected = m_scene->selectedIds();
    QPointF pos = m_view->placementPoint();
    std::string from;
    if (selected.size() == 1) {
        // Below the selected layer, fed by it: building a chain is Enter, Enter, Enter.
        const LayerSpec* l = m_doc->layer(selected.front());
        const NodeItem* n = m_scene->node(selected.front());
        from = selected.front();
        pos = QPointF(l->x, l->y + (n ? std::max(100.0, n->height() + 40) : 100.0));
    }
    const std::string id = m_doc->addLayer(toStdString(type), pos, from);
    if (!id.empty()) {
        m_scene->selectIds({id});
        if (NodeItem* n = m_scene->node(id))
            m_view->ensureVisible(n, 40, 40);
    }
    return id;
}

void MainWindow::copySelection()
{
    const std::vector<std::string> ids = m_scene->selectedIds();
    if (ids.empty())
        return;
    const QByteArray text = QByteArray::fromStdString(m_doc->layersToJson(ids).dump(2));
    auto* mime = new QMimeData;
    mime->setData(QLatin1String(kLayersMimeType), text);
    mime->setText(QString::fromUtf8(text));
    QApplication::clipboard()->setMimeData(mime);
    m_pasteCount = 0;
    statusBar()->showMessage(tr("Copied %1").arg(counted(static_cast<int64_t>(ids.size()), "layer", "layers")), 3000);
}

void MainWindow::cutSelection()
{
    const std::vector<std::string> ids = m_scene->selectedIds();
    if (ids.empty())
        return;
    copySelection();
    m_doc->removeLayers(ids);
    m_pasteCount = -1;  // the first paste after a cut puts the layers back where they were
}

void MainWindow::paste()
{
    const QMimeData* mime = QApplication::clipboard()->mimeData();
    if (!mime)
        return;
    const QByteArray text = mime->hasFormat(QLatin1String(kLayersMimeType))
                                ? mime->data(QLatin1String(kLayersMimeType))
                                : mime->text().toUtf8();
    if (text.trimmed().isEmpty())
        return;
    Result<std::vector<LayerSpec>> layers = ModelDocument::layersFromJson(text.toStdString());
    if (!layers.ok()) {
        statusBar()->showMessage(tr("The clipboard holds no layers: %1").arg(toQString(layers.error().message)), 6000);
        return;
    }
    ++m_pasteCount;
    const double d = 40.0 * std::max(0, m_pasteCount);
    const std::vector<std::string> ids = m_doc->insertLayers(std::move(layers).value(), QPointF(d, d),
                                                             tr("Paste"));
    m_scene->selectIds(ids);
}

void MainWindow::duplicateSelection()
{
    const std::vector<std::string> ids = m_scene->selectedIds();
    if (ids.empty())
        return;
    std::vector<LayerSpec> layers;
    for (const std::string& id : ids)
        layers.push_back(*m_doc->layer(id));
    const std::vector<std::string> fresh = m_doc->insertLayers(std::move(layers), QPointF(40, 40),
                                                               tr("Duplicate %1").arg(counted(static_cast<int64_t>(ids.size()), "layer", "layers")));
    m_scene->selectIds(fresh);
}

void MainWindow::deleteSelection()
{
    m_scene->deleteSelection();
}

void MainWindow::selectAll()
{
    std::vector<std::string> ids;
    for (const LayerSpec& l : m_doc->spec().layers)
        ids.push_back(l.id);
    m_scene->selectIds(ids);
}

void MainWindow::updateSelectionActions()
{
    const bool any = !m_scene->selectedIds().empty();
    for (const char* name : {"cut", "copy", "duplicate"})
        action(QLatin1String(name))->setEnabled(any);
    action(QStringLiteral("delete"))->setEnabled(any || !m_scene->selectedEdges().empty());
}

// ---- analysis, training -----------------------------------------------------------------------

QString MainWindow::trainBlockedReason() const
{
    const GraphAnalysis& a = m_doc->analysis();
    if (a.ok())
        return {};
    QStringList lines;
    lines << tr("Cannot train: the model has %1.").arg(counted(static_cast<int64_t>(a.problems.size()), "problem", "problems"));
    const std::size_t shown = std::min<std::size_t>(a.problems.size(), 5);
    for (std::size_t i = 0; i < shown; ++i)
        lines << QStringLiteral("• ") + toQString(a.problems[i].message);
    if (a.problems.size() > shown)
        lines << tr("… and %1 more (see Problems)").arg(a.problems.size() - shown);
    return lines.join(QLatin1Char('\n'));
}

QString MainWindow::trainCommandLine() const
{
    const ModelSpec& s = m_doc->spec();
    const nlohmann::json& o = s.compile.optimizer;
    QString cmd = QStringLiteral("trainstudio-cli train --model %1")
                      .arg(m_doc->filePath().isEmpty() ? toQString(s.name) + QStringLiteral(".json")
                                                       : QDir::toNativeSeparators(m_doc->filePath()));
    cmd += QStringLiteral(" --epochs %1 --batch-size %2").arg(s.compile.epochs).arg(s.compile.batchSize);
    if (o.is_object() && o.contains("type"))
        cmd += QStringLiteral(" --optimizer ") + toQString(o["type"].get<std::string>());
    if (o.is_object() && o.contains("learning_rate") && o["learning_rate"].is_number())
        cmd += QStringLiteral(" --learning-rate %1").arg(o["learning_rate"].get<double>());
    return cmd;
}

void MainWindow::train()
{
    const QString blocked = trainBlockedReason();
    if (!blocked.isEmpty()) {
        showError(tr("Train"), blocked);
        return;
    }
    showTab(QStringLiteral("train"));
    m_trainPage->setModel(m_doc->spec(), blocked);
    QString why;
    if (!m_session->isActive() && !m_trainPage->startTraining(&why)) statusBar()->showMessage(tr("Cannot train: %1").arg(why), 8000);
}

void MainWindow::showTab(const QString& name)
{
    for (int i = 0; i < m_tabs->count(); ++i)
        if (m_tabs->widget(i)->property("tabName").toString() == name || (i == 0 && name == QLatin1String("design"))
            || (m_tabs->widget(i) == m_trainPage && name == QLatin1String("train")))
            m_tabs->setCurrentIndex(i);
}

void MainWindow::setDatabasePath(const QString& path)
{
    m_session->setDatabasePath(path);
    QString error;
    // An unreadable history is shown in the Runs tab; training reports its own error.
    if (!m_runs->setDatabase(path, &error)) statusBar()->showMessage(tr("Run history: %1").arg(error), 8000);
}

bool MainWindow::openRecordedRun(const QString& runId, QString* error)
{
    store::RunStore* store = m_runs->store();
    if (!store) {
        if (error) *error = tr("no run database is open");
        return false;
    }
    auto data = RunData::load(*store, runId.toStdString());
    if (!data.ok()) {
        if (error) *error = QString::fromStdString(data.error().toString());
        return false;
    }
    auto info = store->run(runId.toStdString());
    const QString name = info.ok() ? QString::fromStdString(info->name) : runId.left(8);
    m_trainPage->showRecordedRun(std::move(data).value(), tr("Run %1 (recorded)").arg(name));
    // Its spans, if it has any, in the profiler (a run without a trace leaves it as it was).
    auto counts = store->counts(runId.toStdString());
    // In the background: a long run's trace takes seconds to read and lay out.
    if (counts.ok() && counts->spans > 0) m_profiler->openRunInBackground(QString::fromStdString(store->path()), runId);
    showTab(QStringLiteral("train"));
    return true;
}

QString MainWindow::currentTab() const
{
    QWidget* w = m_tabs->currentWidget();
    if (w == m_view) return QStringLiteral("design");
    if (w == m_trainPage) return QStringLiteral("train");
    return w->property("tabName").toString();
}

void MainWindow::onTabChanged(int index)
{
    const bool design = m_tabs->widget(index) == m_view;
    // The designer's docks belong to the Design tab; remember which were open.
    if (!design && m_designDocksVisible.empty()) {
        for (QDockWidget* d : m_designDocks) {
            m_designDocksVisible.push_back(d->isVisible());
            d->hide();
        }
    } else if (design && !m_designDocksVisible.empty()) {
        for (std::size_t i = 0; i < m_designDocks.size(); ++i)
            if (m_designDocksVisible[i]) m_designDocks[i]->show();
        m_designDocksVisible.clear();
    }
    if (m_tabs->widget(index) == m_trainPage) m_trainPage->setModel(m_doc->spec(), trainBlockedReason());
}

void MainWindow::updateAnalysisState()
{
    const GraphAnalysis& a = m_doc->analysis();
    const QString blocked = trainBlockedReason();
    QAction* t = action(QStringLiteral("train"));
    t->setEnabled(blocked.isEmpty());
    if (m_tabs->currentWidget() == m_trainPage) m_trainPage->setModel(m_doc->spec(), blocked);
    if (blocked.isEmpty()) {
        t->setToolTip(tr("Train '%1': %2 parameters, batch %3, %4 epoch(s)")
                          .arg(toQString(m_doc->spec().name), exactCount(a.totalParams))
                          .arg(m_doc->spec().compile.batchSize)
                          .arg(m_doc->spec().compile.epochs));
        t->setStatusTip(t->toolTip());
        m_stateLabel->setText(tr("✓ Ready to train"));
        m_stateLabel->setToolTip(t->toolTip());
        m_stateLabel->setStyleSheet(QString());
    } else {
        t->setToolTip(blocked);
        t->setStatusTip(blocked.section(QLatin1Char('\n'), 0, 1));
        m_stateLabel->setText(tr("⚠ %1: cannot train").arg(counted(static_cast<int64_t>(a.problems.size()), "problem", "problems")));
        m_stateLabel->setToolTip(blocked);
        m_stateLabel->setStyleSheet(QStringLiteral("color: %1;").arg(isDarkPalette(palette()) ? QStringLiteral("#f87171")
                                                                                             : QStringLiteral("#dc2626")));
    }
    m_totalsLabel->setText(counted(static_cast<int64_t>(m_doc->spec().layers.size()), "layer", "layers")
                           + QStringLiteral(" · ") + tr("%1 params").arg(exactCount(a.totalParams))
                           + QStringLiteral(" · ") + tr("%1 FLOPs/sample").arg(compactCount(a.totalFlops)));
    if (auto* dock = findChild<QDockWidget*>(QStringLiteral("problemsDock")))
        dock->setWindowTitle(a.problems.empty() ? tr("Problems") : tr("Problems (%1)").arg(a.problems.size()));
}

void MainWindow::updateTitle()
{
    const QString path = m_doc->filePath();
    const QString shown = path.isEmpty() ? tr("%1 (unsaved)").arg(toQString(m_doc->spec().name))
                                         : QFileInfo(path).fileName();
    setWindowTitle(QStringLiteral("%1[*] — TrainStudio").arg(shown));
    setWindowModified(m_doc->isModified());
    setWindowFilePath(path);
}

void MainWindow::showError(const QString& title, const QString& message)
{
    QMessageBox box(QMessageBox::Warning, title, message, QMessageBox::Ok, this);
    box.setObjectName(QStringLiteral("errorBox"));
    box.setTextInteractionFlags(Qt::TextSelectableByMouse);
    box.exec();
}

bool MainWindow::saveScreenshot(const QString& path, QSize size)
{
    resize(size);
    show();
    // Docks, toolbar and status bar settle over a few passes of the event loop.
    for (int i = 0; i < 3; ++i)
        QApplication::processEvents();
    m_doc->analysis();
    m_view->fitToView();
    QApplication::processEvents();
    const QPixmap shot = grab();
    return !shot.isNull() && shot.save(path, "PNG");
}

} // namespace ts
