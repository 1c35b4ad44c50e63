#pragma once
// RunSetupPanel: the run configuration form — dataset and input pipeline, strategy and devices
// (with live state), hyper-parameters, precision policy and seed, and backup and restore. It edits a RunConfig and
// explains what is wrong with it before Train is pressed (problems()).
// Contract: GUI thread only. config() is always a complete RunConfig (the model comes from
// setModel); problems() lists what would make the run fail at once, in words that name the
// field and the fix. Device load refreshes once a second while the panel is visible.

#include <QStringList>
#include <QTimer>
#include <QWidget>

#include <optional>

#include "model/spec.h"
#include "session/localmachine.h"
#include "session/remotecluster.h"
#include "train/run_config.h"

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;
class QListWidget;
class QPlainTextEdit;
class QPushButton;
class QSpinBox;
class QTableWidget;

namespace ts {

class RunSetupPanel : public QWidget {
    Q_OBJECT
public:
    explicit RunSetupPanel(QWidget* parent = nullptr);
    ~RunSetupPanel() override;

    // The model to train: its compile settings become the defaults (epochs, batch, optimizer)
    // unless the user changed them; its input shape decides which augmentations apply.
    void setModel(const ModelSpec& model);
    RunConfig config() const;
    // Fills the form from a configuration (a past run's, a saved one).
    void setConfig(const RunConfig& config);
    QStringList problems() const;
    // A .safetensors file the run starts from instead of the seed's initial weights ("": none);
    // remote runs send it to their workers.
    void setInitialWeights(const QString& path);
    QString initialWeights() const;

    // Strategy as RunConfig names it: "one-device", "mirrored", "multi-worker-mirrored",
    // "parameter-server".
    QString strategy() const;
    void setStrategy(const QString& kind);
    QStringList checkedDevices() const;
    void setCheckedDevices(const QStringList& devices);
    int replicaCount() const;
    QString perReplicaText() const;
    QListWidget* deviceList() const { return m_devices; }
    // Re-reads device load and memory now (the timer does this every second).
    void refreshDeviceState();

    // Remote workers: the TF_CONFIG cluster, token and TLS files. MultiWorkerMirrored and
    // ParameterServer are enabled once the cluster has the roles they need. Remembered across
    // sessions (QSettings) unless setPersistent(false).
    RemoteSettings remoteSettings() const;
    void setRemoteSettings(const RemoteSettings& settings);
    bool isRemoteStrategy() const;
    void setPersistent(bool persistent) { m_persistent = persistent; }
    // Pre-flight of every worker now (off the GUI thread); the table shows the answers.
    void checkWorkers();
    // Export…'s work once a folder is chosen: writes each task's TF_CONFIG file there and says
    // what it wrote (or why not) under the cluster. Returns the files written.
    QStringList exportTfConfigsTo(const QString& dir);
    QLabel* clusterState() const { return m_clusterState; }
    QTableWidget* workerTable() const { return m_workerTable; }
    ClusterProbe* clusterProbe() const { return m_probe; }

Q_SIGNALS:
    void changed();

private:
    void buildUi();
    void updateDerived();
    void updateCluster();
    void showProbe(const QList<WorkerProbeResult>& results);
    QString dataDir() const;
    nlohmann::json pipelineJson(const RunConfig& c) const;

    ModelSpec m_model;
    bool m_imageInput = false;
    std::string m_appliedCompile;
    int64_t m_inputHeight = 0, m_inputWidth = 0;
    QTimer m_loadTimer;
    HostLoadProbe m_hostLoad;

    QComboBox* m_source = nullptr;
    QLineEdit* m_dataDir = nullptr;
    QSpinBox* m_limit = nullptr;
    QCheckBox* m_validate = nullptr;
    QCheckBox* m_usePipeline = nullptr;
    QCheckBox* m_shuffle = nullptr;
    QSpinBox* m_shuffleBuffer = nullptr;
    QComboBox* m_parallelism = nullptr;
    QComboBox* m_prefetch = nullptr;
    QComboBox* m_autoShard = nullptr;
    QCheckBox* m_flip = nullptr;
    QCheckBox* m_crop = nullptr;
    QComboBox* m_strategy = nullptr;
    QListWidget* m_devices = nullptr;
    QSpinBox* m_threads = nullptr;
    QComboBox* m_partitioner = nullptr;  // parameter-server: how variables are spread over the ps tasks
    QSpinBox* m_minShard = nullptr;      // KiB, for by-size
    QSpinBox* m_epochs = nullptr;
    QSpinBox* m_batch = nullptr;
    QLabel* m_perReplica = nullptr;
    QComboBox* m_optimizer = nullptr;
    QDoubleSpinBox* m_lr = nullptr;
    QComboBox* m_schedule = nullptr;
    QComboBox* m_precision = nullptr;
    PrecisionConfig m_precisionConfig;  // a loaded configuration's loss-scale settings
    QSpinBox* m_seed = nullptr;
    QCheckBox* m_backup = nullptr;
    QLineEdit* m_backupDir = nullptr;
    QLineEdit* m_initialWeights = nullptr;
    QSpinBox* m_backupEvery = nullptr;
    QSpinBox* m_restarts = nullptr;
    QLabel* m_problems = nullptr;
    QPlainTextEdit* m_tfConfig = nullptr;
    QLineEdit* m_tokenFile = nullptr;
    QLineEdit* m_tlsCa = nullptr;
    QPushButton* m_checkWorkers = nullptr;
    QTableWidget* m_workerTable = nullptr;
    QLabel* m_clusterState = nullptr;
    ClusterProbe* m_probe = nullptr;
    ClusterSummary m_cluster;
    bool m_persistent = true;
};

} // namespace ts
