#pragma once
// The studio's main window: the model designer (palette, canvas, inspector, problems, history)
// with the file, edit and view commands around it. It owns one ModelDocument; everything shown
// is a view of it and every edit goes through its undo stack.

#include <QMainWindow>
#include <QPointF>
#include <QStringList>

#include <string>
#include <vector>

class QAction;
class QActionGroup;
class QDockWidget;
class QLabel;
class QListView;
class QTabWidget;
class QMenu;
class QUndoView;

namespace ts {

class DesignerScene;
class DesignerView;
class Inspector;
class ModelDocument;
class PaletteWidget;
class ProblemsModel;
class ProfilerPanel;
class RunHistoryPanel;
class TrainPage;
class TrainingSession;

class MainWindow : public QMainWindow {
    Q_OBJECT
public:
    explicit MainWindow(QWidget* parent = nullptr);
    ~MainWindow() override;

    ModelDocument* document() const { return m_doc; }
    DesignerScene* scene() const { return m_scene; }
    DesignerView* view() const { return m_view; }
    Inspector* inspector() const { return m_inspector; }
    PaletteWidget* layerPalette() const { return m_palette; }
    ProblemsModel* problemsModel() const { return m_problems; }
    QUndoView* historyView() const { return m_history; }
    TrainingSession* session() const { return m_session; }
    TrainPage* trainPage() const { return m_trainPage; }
    ProfilerPanel* profiler() const { return m_profiler; }
    RunHistoryPanel* runHistory() const { return m_runs; }
    // The run database the session records into and the history shows.
    void setDatabasePath(const QString& path);
    // Opens a recorded run: its dashboards on the Train tab and its trace in the profiler.
    bool openRecordedRun(const QString& runId, QString* error = nullptr);
    // The central tabs: "design", "train" (run setup + dashboards), "profiler", "runs".
    QTabWidget* tabs() const { return m_tabs; }
    void showTab(const QString& name);
    QString currentTab() const;
    // Actions by name: "new", "open", "save", "saveAs", "importKeras", "exportKerasJson",
    // "exportKerasScript", "undo", "redo", "cut", "copy", "paste", "duplicate", "delete",
    // "selectAll", "zoomIn", "zoomOut", "resetZoom", "fitToView", "autoLayout", "train", ...
    QAction* action(const QString& name) const;

    // Files (no dialogs; the menu commands ask for paths and call these). Errors are returned
    // and, unless `error` is given, shown in a message box.
    bool openFile(const QString& path, QString* error = nullptr);  // ours or Keras (import)
    bool saveFile(const QString& path, QString* error = nullptr);
    bool exportKerasJson(const QString& path, QString* error = nullptr);
    bool exportKerasScript(const QString& path, QString* error = nullptr);
    // A new model from a template ("seed_mlp", "small_cnn", "small_resnet"; "" = empty).
    bool newFromTemplate(const QString& name);
    static QStringList templateNames();
    static QString templateTitle(const QString& name);

    // Adds a layer as the palette does (below the single selected layer, connected to it).
    std::string addLayerFromPalette(const QString& type);
    std::string addLayerAt(const QString& type, QPointF scenePos);

    // Empty when the model can be trained, else why not (the Train action's tooltip too).
    QString trainBlockedReason() const;
    // Ask before stopping a running training when the window closes (tests turn it off).
    void setConfirmStopOnClose(bool on) { m_confirmStop = on; }
    // What Train would run, as a trainstudio-cli command line.
    QString trainCommandLine() const;
    QStringList recentFiles() const;

    // Lays the window out at `size`, fits the model into view and saves a PNG.
    bool saveScreenshot(const QString& path, QSize size = QSize(1440, 900));

public Q_SLOTS:
    void copySelection();
    void cutSelection();
    void paste();
    void duplicateSelection();
    void deleteSelection();
    void selectAll();
    void train();

protected:
    void closeEvent(QCloseEvent* event) override;
    void dragEnterEvent(QDragEnterEvent* event) override;
    void dropEvent(QDropEvent* event) override;

private:
    void createActions();
    void createMenus();
    void createDocks();
    void restoreSettings();
    bool maybeSave();
    bool saveInteractive(bool askPath);
    void openInteractive();
    void importKerasInteractive();
    void exportKerasJsonInteractive();
    void exportKerasScriptInteractive();
    void addRecentFile(const QString& path);
    void rebuildRecentMenu();
    void updateTitle();
    void updateAnalysisState();
    void updateSelectionActions();
    void showError(const QString& title, const QString& message);
    void setTheme(const QString& mode);
    void onTabChanged(int index);
    QAction* makeAction(const QString& name, const QString& text, const QKeySequence& shortcut = {},
                        const QString& tip = {});
    QString lastDirectory() const;
    void rememberDirectory(const QString& path);

    ModelDocument* m_doc;
    DesignerScene* m_scene;
    DesignerView* m_view;
    PaletteWidget* m_palette;
    Inspector* m_inspector;
    ProblemsModel* m_problems;
    QListView* m_problemsView = nullptr;
    QUndoView* m_history = nullptr;
    QMenu* m_recentMenu = nullptr;
    QActionGroup* m_themeGroup = nullptr;
    QLabel* m_totalsLabel = nullptr;
    QLabel* m_stateLabel = nullptr;
    QLabel* m_zoomLabel = nullptr;
    std::vector<QAction*> m_actions;
    QTabWidget* m_tabs = nullptr;
    TrainingSession* m_session = nullptr;
    TrainPage* m_trainPage = nullptr;
    ProfilerPanel* m_profiler = nullptr;
    RunHistoryPanel* m_runs = nullptr;
    std::vector<QDockWidget*> m_designDocks;
    std::vector<bool> m_designDocksVisible;
    bool m_confirmStop = true;
    int m_pasteCount = 0;
};

} // namespace ts
