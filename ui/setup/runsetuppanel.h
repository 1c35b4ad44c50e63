#pragma once
// RunSetupPanel: the run configuration form — dataset and input pipeline, strategy and devices
// (with live state), hyper-parameters, precision policy and seed. It edits a RunConfig and
// explains what is wrong with it before Train is pressed (problems()).
// Contract: GUI thread only. config() is always a complete RunConfig (the model comes from
// setModel); problems() lists what would make the run fail at once, in words that name the
// field and the fix. Device load refreshes once a second while the panel is visible.

#include <QStringList>
#include <QTimer>
#include <QWidget>

#include <optional>

#include "model/spec.h"
#include "telemetry/sampler.h"
#include "train/run_config.h"

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;
class QListWidget;
class QSpinBox;

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

Q_SIGNALS:
    void changed();

private:
    void buildUi();
    void updateDerived();
    QString dataDir() const;
    nlohmann::json pipelineJson(const RunConfig& c) const;

    ModelSpec m_model;
    bool m_imageInput = false;
    std::string m_appliedCompile;
    int64_t m_inputHeight = 0, m_inputWidth = 0;
    QTimer m_loadTimer;
    std::optional<telemetry::CpuJiffies> m_lastJiffies;

    QComboBox* m_source = nullptr;
    QLineEdit* m_dataDir = nullptr;
    QSpinBox* m_limit = nullptr;
    QCheckBox* m_validate = nullptr;
    QCheckBox* m_usePipeline = nullptr;
    QCheckBox* m_shuffle = nullptr;
    QSpinBox* m_shuffleBuffer = nullptr;
    QComboBox* m_parallelism = nullptr;
    QComboBox* m_prefetch = nullptr;
    QCheckBox* m_flip = nullptr;
    QCheckBox* m_crop = nullptr;
    QComboBox* m_strategy = nullptr;
    QListWidget* m_devices = nullptr;
    QSpinBox* m_threads = nullptr;
    QSpinBox* m_epochs = nullptr;
    QSpinBox* m_batch = nullptr;
    QLabel* m_perReplica = nullptr;
    QComboBox* m_optimizer = nullptr;
    QDoubleSpinBox* m_lr = nullptr;
    QComboBox* m_schedule = nullptr;
    QComboBox* m_precision = nullptr;
    QSpinBox* m_seed = nullptr;
    QLabel* m_problems = nullptr;
};

} // namespace ts
