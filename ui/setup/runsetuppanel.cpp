#include "setup/runsetuppanel.h"

#include <functional>

#include <QCheckBox>
#include <QComboBox>
#include <QDir>
#include <QDoubleSpinBox>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QFontDatabase>
#include <QFormLayout>
#include <QHeaderView>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSettings>
#include <QSpinBox>
#include <QStandardItemModel>
#include <QTableWidget>
#include <QVBoxLayout>

#include <thread>

#include "session/trainingsession.h"

namespace ts {
namespace {

// A folder field with a Browse… button beside it; `chosen` gets the folder picked in the dialog.
QHBoxLayout* folderRow(QWidget* owner, QLineEdit* edit, const QString& dialogTitle, std::function<void(const QString&)> chosen)
{
    auto* browse = new QPushButton(QObject::tr("Browse…"));
    auto* row = new QHBoxLayout;
    row->addWidget(edit, 1);
    row->addWidget(browse);
    QObject::connect(browse, &QPushButton::clicked, owner, [owner, edit, dialogTitle, chosen = std::move(chosen)] {
        const QString dir = QFileDialog::getExistingDirectory(owner, dialogTitle, edit->text());
        if (!dir.isEmpty()) chosen(dir);
    });
    return row;
}

QString bytesText(uint64_t b)
{
    if (b == 0) return QObject::tr("unknown");
    return QStringLiteral("%1 GiB").arg(static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0), 0, 'f', 1);
}

// Disables one entry of a combo box with a reason (Qt has no direct API for it).
void setComboItemEnabled(QComboBox* box, int index, bool enabled, const QString& why)
{
    auto* model = qobject_cast<QStandardItemModel*>(box->model());
    if (!model) return;
    QStandardItem* item = model->item(index);
    item->setEnabled(enabled);
    item->setToolTip(enabled ? QString() : why);
}

const char* kStrategies[] = {"one-device", "mirrored", "multi-worker-mirrored", "parameter-server"};

} // namespace

RunSetupPanel::RunSetupPanel(QWidget* parent) : QWidget(parent)
{
    buildUi();
    {
        const QSettings settings;
        RemoteSettings r;
        r.tfConfig = settings.value("cluster/tfConfig").toString();
        r.tokenFile = settings.value("cluster/tokenFile").toString();
        r.tlsCa = settings.value("cluster/tlsCa").toString();
        setRemoteSettings(r);
    }
    connect(&m_loadTimer, &QTimer::timeout, this, &RunSetupPanel::refreshDeviceState);
    m_loadTimer.start(1000);
    refreshDeviceState();
    updateDerived();
}

RunSetupPanel::~RunSetupPanel() = default;

void RunSetupPanel::buildUi()
{
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);

    // --- dataset and pipeline
    auto* data = new QGroupBox(tr("Dataset and input pipeline"));
    auto* df = new QFormLayout(data);
    m_source = new QComboBox;
    m_source->addItems({tr("Fashion-MNIST (built-in)"), tr("IDX folder (MNIST layout)")});
    m_source->setObjectName("source");
    df->addRow(tr("Source"), m_source);
    m_dataDir = new QLineEdit;
    m_dataDir->setObjectName("dataDir");
    m_dataDir->setPlaceholderText(tr("folder with train-images-idx3-ubyte[.gz], ..."));
    df->addRow(tr("Folder"), folderRow(this, m_dataDir, tr("IDX data folder"), [this](const QString& dir) {
                   m_source->setCurrentIndex(1);
                   m_dataDir->setText(dir);
               }));
    m_limit = new QSpinBox;
    m_limit->setRange(0, 100'000'000);
    m_limit->setSpecialValueText(tr("all"));
    m_limit->setObjectName("limit");
    df->addRow(tr("Training examples"), m_limit);
    m_validate = new QCheckBox(tr("Validate after each epoch"));
    m_validate->setChecked(true);
    m_validate->setToolTip(tr("Evaluate on the test split after each epoch (val_loss, val_accuracy)"));
    df->addRow(QString(), m_validate);
    m_usePipeline = new QCheckBox(tr("tf.data pipeline"));
    m_usePipeline->setObjectName("usePipeline");
    m_usePipeline->setToolTip(tr("Parallel map, shuffle buffer, prefetch and augmentation like tf.data.\nOff: batches are gathered from memory (fastest for datasets that fit in RAM)"));
    df->addRow(QString(), m_usePipeline);
    m_shuffle = new QCheckBox(tr("Shuffle"));
    m_shuffle->setChecked(true);
    m_shuffleBuffer = new QSpinBox;
    m_shuffleBuffer->setRange(1, 10'000'000);
    m_shuffleBuffer->setValue(60000);
    m_shuffleBuffer->setObjectName("shuffleBuffer");
    auto* shRow = new QHBoxLayout;
    shRow->addWidget(m_shuffle);
    shRow->addWidget(new QLabel(tr("buffer")));
    shRow->addWidget(m_shuffleBuffer, 1);
    df->addRow(tr("Shuffle"), shRow);
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    m_parallelism = new QComboBox;
    m_parallelism->addItem(tr("AUTOTUNE"), -1);
    for (int i = 1; i <= cores; ++i) m_parallelism->addItem(QString::number(i), i);
    m_parallelism->setObjectName("parallelism");
    df->addRow(tr("Map parallelism"), m_parallelism);
    m_prefetch = new QComboBox;
    m_prefetch->addItem(tr("AUTOTUNE"), -1);
    for (int i : {0, 1, 2, 4, 8}) m_prefetch->addItem(QString::number(i), i);
    m_prefetch->setObjectName("prefetch");
    df->addRow(tr("Prefetch (batches)"), m_prefetch);
    // tf.data's auto_shard_policy: how a multi-worker run divides the pipeline's data.
    m_autoShard = new QComboBox;
    m_autoShard->addItem(tr("Auto (by file if enough files, else by element)"), QStringLiteral("auto"));
    m_autoShard->addItem(tr("By element"), QStringLiteral("data"));
    m_autoShard->addItem(tr("By file"), QStringLiteral("file"));
    m_autoShard->addItem(tr("Off (every worker reads everything)"), QStringLiteral("off"));
    m_autoShard->setObjectName("autoShard");
    // The form's pipeline reads one IDX dataset: there are no files to deal (a loaded run
    // configuration may still say "file", and the form then says why it cannot run).
    setComboItemEnabled(m_autoShard, 2, false, tr("the dataset is one set of IDX files; by file needs a source of several files"));
    m_autoShard->setToolTip(tr("MultiWorkerMirrored and ParameterServer: each worker reads, decodes and maps only its part of "
                               "the data.\nOff: every worker runs the whole pipeline and trains on its rows of each batch "
                               "(the run then equals one process exactly, at the cost of the input work)."));
    df->addRow(tr("Input sharding"), m_autoShard);
    m_flip = new QCheckBox(tr("Random flip"));
    m_crop = new QCheckBox(tr("Random crop"));
    m_crop->setStatusTip(tr("Random crop to the input size after padding 4 pixels"));
    auto* augRow = new QHBoxLayout;
    augRow->addWidget(m_flip);
    augRow->addWidget(m_crop);
    df->addRow(tr("Augmentation"), augRow);
    layout->addWidget(data);

    // --- strategy and devices
    auto* dist = new QGroupBox(tr("Strategy and devices"));
    auto* sf = new QFormLayout(dist);
    m_strategy = new QComboBox;
    m_strategy->addItems({tr("OneDevice"), tr("Mirrored (local devices)"), tr("MultiWorkerMirrored"), tr("ParameterServer")});
    m_strategy->setObjectName("strategy");
    const QString noCluster = tr("needs remote workers described TF_CONFIG-style; no cluster is configured");
    setComboItemEnabled(m_strategy, 2, false, noCluster);
    setComboItemEnabled(m_strategy, 3, false, noCluster);
    sf->addRow(tr("Strategy"), m_strategy);
    m_devices = new QListWidget;
    m_devices->setObjectName("devices");
    m_devices->setMaximumHeight(120);
    for (const LocalDevice& d : localDevices()) {
        auto* item = new QListWidgetItem(d.id);
        item->setData(Qt::UserRole, d.id);
        item->setData(Qt::UserRole + 1, d.name);
        item->setFlags(item->flags() | Qt::ItemIsUserCheckable);
        item->setCheckState(Qt::Checked);
        m_devices->addItem(item);
    }
    sf->addRow(tr("Devices"), m_devices);
    // Default: Mirrored over every local device (OneDevice when there is only one).
    m_strategy->setCurrentIndex(m_devices->count() > 1 ? 1 : 0);
    m_threads = new QSpinBox;
    m_threads->setRange(0, 1024);
    m_threads->setSpecialValueText(tr("all cores"));
    m_threads->setObjectName("threads");
    sf->addRow(tr("CPU threads"), m_threads);
    // ParameterServer: which ps task holds what (TF's variable_partitioner).
    m_partitioner = new QComboBox;
    m_partitioner->addItem(tr("Round-robin (whole variables)"), QStringLiteral("round-robin"));
    m_partitioner->addItem(tr("By size (split large variables)"), QStringLiteral("by-size"));
    m_partitioner->setObjectName("partitioner");
    m_partitioner->setToolTip(tr("ParameterServer: round-robin places each variable whole on the next ps task (TF without a "
                                 "partitioner); by size splits a variable along its first dimension into shards of at least the "
                                 "minimum size, over as many ps tasks as that allows (TF's MinSizePartitioner), so one large "
                                 "layer does not make one ps task the bottleneck"));
    sf->addRow(tr("Variables on ps tasks"), m_partitioner);
    m_minShard = new QSpinBox;
    m_minShard->setRange(1, 1 << 20);
    m_minShard->setValue(static_cast<int>(PartitionOptions{}.minShardBytes >> 10));
    m_minShard->setSuffix(tr(" KiB"));
    m_minShard->setObjectName("minShard");
    m_minShard->setToolTip(tr("By size: the smallest shard a variable is split into (TF's default is 256 KiB)"));
    sf->addRow(tr("Minimum shard"), m_minShard);
    layout->addWidget(dist);

    // --- remote workers: TF_CONFIG as TensorFlow users already write it
    auto* workers = new QGroupBox(tr("Remote workers (TF_CONFIG)"));
    auto* wf = new QFormLayout(workers);
    m_tfConfig = new QPlainTextEdit;
    m_tfConfig->setObjectName("tfConfig");
    m_tfConfig->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
    m_tfConfig->setPlaceholderText(R"({"cluster": {"chief": ["host1:7070"], "worker": ["host2:7070"]}})");
    m_tfConfig->setMaximumHeight(90);
    m_tfConfig->setToolTip(tr("The cluster's trainstudio-worker daemons, TensorFlow's TF_CONFIG format; a \"task\" entry is ignored"));
    auto* loadTf = new QPushButton(tr("Load…"));
    loadTf->setToolTip(tr("Read a TF_CONFIG file"));
    auto* exportTf = new QPushButton(tr("Export…"));
    exportTf->setObjectName("exportTfConfig");
    exportTf->setToolTip(tr("Write each task's TF_CONFIG into a folder, one file per task, for machines that run their task "
                            "themselves (trainstudio-cli train --tf-config FILE)"));
    auto* tfButtons = new QVBoxLayout;
    tfButtons->addWidget(loadTf);
    tfButtons->addWidget(exportTf);
    tfButtons->addStretch(1);
    auto* tfRow = new QHBoxLayout;
    tfRow->addWidget(m_tfConfig, 1);
    tfRow->addLayout(tfButtons);
    wf->addRow(tr("Cluster"), tfRow);
    m_tokenFile = new QLineEdit;
    m_tokenFile->setObjectName("tokenFile");
    m_tokenFile->setPlaceholderText(tr("token file (empty: $TRAINSTUDIO_TOKEN)"));
    auto* tokenBrowse = new QPushButton(tr("Browse…"));
    auto* tokRow = new QHBoxLayout;
    tokRow->addWidget(m_tokenFile, 1);
    tokRow->addWidget(tokenBrowse);
    wf->addRow(tr("Token"), tokRow);
    m_tlsCa = new QLineEdit;
    m_tlsCa->setObjectName("tlsCa");
    m_tlsCa->setPlaceholderText(tr("CA certificate (empty: no TLS)"));
    wf->addRow(tr("TLS"), m_tlsCa);
    m_checkWorkers = new QPushButton(tr("Check workers"));
    m_checkWorkers->setObjectName("checkWorkers");
    m_checkWorkers->setToolTip(tr("Ask every task's worker who it is: reachable, same version, idle"));
    m_clusterState = new QLabel;
    m_clusterState->setObjectName("clusterState");
    m_clusterState->setWordWrap(true);
    auto* checkRow = new QHBoxLayout;
    checkRow->addWidget(m_checkWorkers);
    checkRow->addWidget(m_clusterState, 1);
    wf->addRow(QString(), checkRow);
    m_workerTable = new QTableWidget(0, 3);
    m_workerTable->setObjectName("workerTable");
    m_workerTable->setHorizontalHeaderLabels({tr("Task"), tr("Address"), tr("State")});
    m_workerTable->horizontalHeader()->setStretchLastSection(true);
    m_workerTable->verticalHeader()->hide();
    m_workerTable->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_workerTable->setMaximumHeight(110);
    wf->addRow(m_workerTable);
    layout->addWidget(workers);
    m_probe = new ClusterProbe(this);
    connect(m_probe, &ClusterProbe::finished, this, &RunSetupPanel::showProbe);
    connect(m_checkWorkers, &QPushButton::clicked, this, &RunSetupPanel::checkWorkers);
    connect(exportTf, &QPushButton::clicked, this, [this] {
        const QString dir = QFileDialog::getExistingDirectory(this, tr("Folder for the tasks' TF_CONFIG files"));
        if (!dir.isEmpty()) exportTfConfigsTo(dir);
    });
    connect(loadTf, &QPushButton::clicked, this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("TF_CONFIG file"), QString(), tr("JSON (*.json);;All files (*)"));
        if (path.isEmpty()) return;
        QFile f(path);
        if (!f.open(QIODevice::ReadOnly)) {
            m_clusterState->setText(tr("cannot read %1: %2").arg(path, f.errorString()));
            return;
        }
        m_tfConfig->setPlainText(QString::fromUtf8(f.readAll()));
    });
    connect(tokenBrowse, &QPushButton::clicked, this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("Token file"), m_tokenFile->text());
        if (!path.isEmpty()) m_tokenFile->setText(path);
    });
    connect(m_tfConfig, &QPlainTextEdit::textChanged, this, [this] { updateCluster(); });
    for (QLineEdit* e : {m_tokenFile, m_tlsCa}) connect(e, &QLineEdit::textChanged, this, [this] { updateCluster(); });

    // --- hyper-parameters
    auto* hyper = new QGroupBox(tr("Hyper-parameters"));
    auto* hf = new QFormLayout(hyper);
    m_epochs = new QSpinBox;
    m_epochs->setRange(1, 100000);
    m_epochs->setObjectName("epochs");
    hf->addRow(tr("Epochs"), m_epochs);
    m_batch = new QSpinBox;
    m_batch->setRange(1, 1 << 20);
    m_batch->setObjectName("batch");
    m_perReplica = new QLabel;
    m_perReplica->setObjectName("perReplica");
    auto* bRow = new QHBoxLayout;
    bRow->addWidget(m_batch, 1);
    bRow->addWidget(m_perReplica);
    hf->addRow(tr("Global batch"), bRow);
    m_optimizer = new QComboBox;
    m_optimizer->addItems({"adam", "adamw", "sgd", "rmsprop"});
    m_optimizer->setObjectName("optimizer");
    hf->addRow(tr("Optimizer"), m_optimizer);
    m_lr = new QDoubleSpinBox;
    m_lr->setDecimals(6);
    m_lr->setRange(0, 10);
    m_lr->setSingleStep(1e-4);
    m_lr->setObjectName("learningRate");
    hf->addRow(tr("Learning rate"), m_lr);
    m_schedule = new QComboBox;
    m_schedule->addItem(tr("constant"), "constant");
    m_schedule->addItem(tr("cosine decay over the run"), "cosine");
    m_schedule->addItem(tr("step decay (x0.1 every epoch)"), "step");
    m_schedule->setObjectName("schedule");
    hf->addRow(tr("Schedule"), m_schedule);
    m_precision = new QComboBox;
    m_precision->addItem(tr("float32"), "float32");
    m_precision->addItem(tr("mixed bfloat16"), "mixed_bfloat16");
    m_precision->addItem(tr("mixed float16 (dynamic loss scaling)"), "mixed_float16");
    m_precision->setObjectName("precision");
    m_precision->setToolTip(tr("Keras' mixed-precision policies: dense and convolution layers compute in 16 bits while the "
                               "weights stay float32.\nmixed bfloat16 runs natively on CPUs with AVX512-BF16; mixed float16 "
                               "scales the loss (2^15 to start, halved on overflow) and pays on GPUs — on a CPU it only "
                               "reproduces float16's numerics, more slowly."));
    hf->addRow(tr("Precision"), m_precision);
    m_seed = new QSpinBox;
    m_seed->setRange(0, std::numeric_limits<int>::max());
    m_seed->setObjectName("seed");
    hf->addRow(tr("Seed"), m_seed);
    m_initialWeights = new QLineEdit;
    m_initialWeights->setObjectName("initialWeights");
    m_initialWeights->setPlaceholderText(tr("the seed's initial weights"));
    m_initialWeights->setToolTip(tr("Start from saved weights (.safetensors, e.g. a run's final weights: Runs > Train From Its "
                                    "Weights) to fine-tune or continue it; the model must have the same layers and shapes"));
    auto* weightsBrowse = new QPushButton(tr("Browse…"));
    auto* weightsRow = new QHBoxLayout;
    weightsRow->addWidget(m_initialWeights, 1);
    weightsRow->addWidget(weightsBrowse);
    hf->addRow(tr("Start from weights"), weightsRow);
    connect(weightsBrowse, &QPushButton::clicked, this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("Initial weights"), m_initialWeights->text(),
                                                          tr("safetensors (*.safetensors);;All files (*)"));
        if (!path.isEmpty()) m_initialWeights->setText(path);
    });
    layout->addWidget(hyper);

    // --- backup and restore (Keras BackupAndRestore)
    auto* backup = new QGroupBox(tr("Backup and restore"));
    auto* bf = new QFormLayout(backup);
    m_backup = new QCheckBox(tr("Back the run up, and resume from the backup when it is started again"));
    m_backup->setObjectName("backup");
    m_backup->setToolTip(tr("Weights, optimizer state and the data position: a resumed run continues exactly as if it had "
                            "not stopped. A run that completes deletes its backup."));
    bf->addRow(QString(), m_backup);
    m_backupDir = new QLineEdit;
    m_backupDir->setObjectName("backupDir");
    bf->addRow(tr("Folder"), folderRow(this, m_backupDir, tr("Backup folder"), [this](const QString& dir) { m_backupDir->setText(dir); }));
    m_backupEvery = new QSpinBox;
    m_backupEvery->setRange(0, 1 << 30);
    m_backupEvery->setSpecialValueText(tr("after each epoch"));
    m_backupEvery->setSuffix(tr(" steps"));
    m_backupEvery->setObjectName("backupEvery");
    bf->addRow(tr("Back up every"), m_backupEvery);
    m_restarts = new QSpinBox;
    m_restarts->setRange(0, 100);
    m_restarts->setSpecialValueText(tr("never"));
    m_restarts->setSuffix(tr(" time(s)"));
    m_restarts->setObjectName("restarts");
    bf->addRow(tr("Restart a failed run"), m_restarts);
    layout->addWidget(backup);
    connect(m_backup, &QCheckBox::toggled, this, [this](bool on) {
        // A sensible place to start from: the model's name, under the worker's backup root for
        // remote runs, under this user's data folder here.
        if (on && m_backupDir->text().trimmed().isEmpty()) {
            const QString name = QString::fromStdString(m_model.name.empty() ? std::string("model") : m_model.name);
            m_backupDir->setText(isRemoteStrategy() ? name : QDir(TrainingSession::defaultBackupFolder()).filePath(name));
        }
    });

    m_problems = new QLabel;
    m_problems->setObjectName("problems");
    m_problems->setWordWrap(true);
    m_problems->setStyleSheet("QLabel { color: #c0392b; }");
    layout->addWidget(m_problems);
    layout->addStretch(1);

    connect(m_source, &QComboBox::currentIndexChanged, this, [this](int i) {
        if (i == 0) m_dataDir->setText(defaultDataDirectory());
        m_dataDir->setReadOnly(i == 0);
    });
    m_dataDir->setText(defaultDataDirectory());
    m_dataDir->setReadOnly(true);
    auto changedSignal = [this] { updateDerived(); };
    for (QSpinBox* s : {m_limit, m_shuffleBuffer, m_threads, m_epochs, m_batch, m_seed, m_backupEvery, m_restarts, m_minShard})
        connect(s, &QSpinBox::valueChanged, this, changedSignal);
    connect(m_backupDir, &QLineEdit::textChanged, this, changedSignal);
    connect(m_initialWeights, &QLineEdit::textChanged, this, changedSignal);
    for (QComboBox* c : {m_source, m_parallelism, m_prefetch, m_autoShard, m_strategy, m_optimizer, m_schedule, m_partitioner, m_precision})
        connect(c, &QComboBox::currentIndexChanged, this, changedSignal);
    for (QCheckBox* c : {m_validate, m_usePipeline, m_shuffle, m_flip, m_crop, m_backup})
        connect(c, &QCheckBox::toggled, this, changedSignal);
    connect(m_lr, &QDoubleSpinBox::valueChanged, this, changedSignal);
    connect(m_dataDir, &QLineEdit::textChanged, this, changedSignal);
    connect(m_devices, &QListWidget::itemChanged, this, changedSignal);
}

void RunSetupPanel::setModel(const ModelSpec& model)
{
    m_model = model;
    const GraphAnalysis a = analyzeModel(model);
    m_imageInput = false;
    for (int i : a.inputNodes) {
        const Shape& shape = a.nodes[static_cast<std::size_t>(i)].outputShape;
        if (shape.rank() == 3) {
            m_imageInput = true;
            m_inputHeight = shape[0];
            m_inputWidth = shape[1];
        }
    }
    // The model's compile settings are defaults: re-applied only when they change, so the
    // user's edits survive switching tabs.
    const std::string compile = nlohmann::json{{"o", model.compile.optimizer}, {"e", model.compile.epochs},
                                               {"b", model.compile.batchSize}, {"p", precisionPolicyName(model.compile.precision)}}.dump();
    if (compile == m_appliedCompile) {
        updateDerived();
        return;
    }
    m_appliedCompile = compile;
    const QSignalBlocker b1(m_epochs), b2(m_batch), b3(m_optimizer), b4(m_lr), b5(m_precision);
    m_precision->setCurrentIndex(std::max(0, m_precision->findData(QString(precisionPolicyName(model.compile.precision)))));
    m_epochs->setValue(static_cast<int>(std::max<int64_t>(1, model.compile.epochs)));
    m_batch->setValue(static_cast<int>(std::max<int64_t>(1, model.compile.batchSize)));
    const nlohmann::json& opt = model.compile.optimizer;
    const QString type = QString::fromStdString(opt.value("type", std::string("adam")));
    if (m_optimizer->findText(type) >= 0) m_optimizer->setCurrentText(type);
    m_lr->setValue(opt.value("learning_rate", 1e-3));
    updateDerived();
}

QString RunSetupPanel::strategy() const { return QString::fromLatin1(kStrategies[std::max(0, m_strategy->currentIndex())]); }

void RunSetupPanel::setStrategy(const QString& kind)
{
    for (int i = 0; i < 4; ++i)
        if (kind == QLatin1String(kStrategies[i])) m_strategy->setCurrentIndex(i);
}

QStringList RunSetupPanel::checkedDevices() const
{
    QStringList out;
    for (int i = 0; i < m_devices->count(); ++i)
        if (m_devices->item(i)->checkState() == Qt::Checked) out << m_devices->item(i)->data(Qt::UserRole).toString();
    return out;
}

void RunSetupPanel::setCheckedDevices(const QStringList& devices)
{
    for (int i = 0; i < m_devices->count(); ++i) {
        QListWidgetItem* item = m_devices->item(i);
        item->setCheckState(devices.contains(item->data(Qt::UserRole).toString()) ? Qt::Checked : Qt::Unchecked);
    }
}

int RunSetupPanel::replicaCount() const
{
    // Remote: one replica per training task (each worker trains on its cpu:0).
    if (isRemoteStrategy()) return m_cluster.valid ? static_cast<int>(m_cluster.trainingTasks.size()) : 0;
    const int n = static_cast<int>(checkedDevices().size());
    return strategy() == "one-device" ? std::min(n, 1) : n;
}

QString RunSetupPanel::perReplicaText() const { return m_perReplica->text(); }

QString RunSetupPanel::dataDir() const { return m_dataDir->text().trimmed(); }

void RunSetupPanel::updateDerived()
{
    const int replicas = std::max(1, replicaCount());
    const int batch = m_batch->value();
    m_perReplica->setText(batch % replicas == 0 ? tr("%1 per replica × %2").arg(batch / replicas).arg(replicas)
                                                : tr("not divisible by %1 replicas").arg(replicas));
    const bool remote = isRemoteStrategy();
    m_devices->setEnabled(!remote);
    m_devices->setToolTip(remote ? tr("each remote worker trains on its own devices; the list is this machine's") : QString());
    m_threads->setEnabled(!remote);
    const bool ps = strategy() == QLatin1String("parameter-server");
    m_partitioner->setEnabled(ps);
    m_minShard->setEnabled(ps && m_partitioner->currentData().toString() == QLatin1String("by-size"));
    const QString notPs = tr("for ParameterServer runs: it places the variables on the ps tasks");
    m_partitioner->setStatusTip(ps ? QString() : notPs);
    m_minShard->setStatusTip(ps ? QString() : notPs);
    const bool pipe = m_usePipeline->isChecked();
    for (QWidget* w : std::initializer_list<QWidget*>{m_shuffleBuffer, m_parallelism, m_prefetch}) w->setEnabled(pipe);
    m_autoShard->setEnabled(pipe && remote);
    const QString noImage = tr("augmentation needs an image input (height, width, channels); this model's input is flat");
    for (QCheckBox* c : {m_flip, m_crop}) {
        c->setEnabled(pipe && m_imageInput);
        c->setToolTip(m_imageInput ? QString() : noImage);
    }
    const bool backup = m_backup->isChecked();
    for (QWidget* w : std::initializer_list<QWidget*>{m_backupDir, m_backupEvery}) w->setEnabled(backup);
    // Local runs resume when started again; restarting on failure is the coordinator's job.
    m_restarts->setEnabled(backup && remote);
    m_restarts->setToolTip(remote ? tr("when a worker dies or is cut off, wait for every worker to answer again and restart the run "
                                       "from its backup; a parameter-server run goes on without a lost worker or evaluator, which "
                                       "rejoins once its daemon answers again (each rejoin counts as a restart)")
                                  : tr("automatic restarts are for remote workers; start a local run again to resume it"));
    m_backupDir->setToolTip(remote ? tr("a folder name, kept under each worker's --backup-root (only the chief writes it)")
                                   : tr("a folder on this machine"));
    const QStringList p = problems();
    m_problems->setText(p.isEmpty() ? QString() : QStringLiteral("• ") + p.join(QStringLiteral("\n• ")));
    Q_EMIT changed();
}

QStringList RunSetupPanel::problems() const
{
    QStringList p;
    const QStringList devices = checkedDevices();
    if (isRemoteStrategy()) p << remoteProblems(remoteSettings(), strategy());
    else if (devices.isEmpty()) p << tr("Devices: check at least one device to train on.");
    if (strategy() == "one-device" && devices.size() > 1)
        p << tr("Strategy: OneDevice trains on one device but %1 are checked; choose Mirrored to use them all, or uncheck all but one.")
                 .arg(devices.size());
    const int replicas = std::max(1, replicaCount());
    if (m_batch->value() % replicas != 0)
        p << tr("Global batch: %1 is not divisible by the %2 replicas; use %3 or %4.")
                 .arg(m_batch->value())
                 .arg(replicas)
                 .arg(m_batch->value() / replicas * replicas == 0 ? replicas : m_batch->value() / replicas * replicas)
                 .arg((m_batch->value() / replicas + 1) * replicas);
    if (m_lr->value() <= 0) p << tr("Learning rate: must be greater than 0 (try 0.001 for adam).");
    if (const QString w = m_initialWeights->text().trimmed(); !w.isEmpty() && !QFileInfo(w).isFile())
        p << tr("Start from weights: %1 is not a file; choose a .safetensors file or clear the field.").arg(QDir::toNativeSeparators(w));
    if (m_backup->isChecked()) {
        const QString dir = m_backupDir->text().trimmed();
        if (dir.isEmpty())
            p << tr("Backup: choose the folder to back the run up into.");
        else if (isRemoteStrategy() && (QDir::isAbsolutePath(dir) || dir.split('/').contains("..")))
            p << tr("Backup: for remote workers give a folder name without '..' (each worker keeps it under its --backup-root), "
                    "not %1.")
                     .arg(dir);
    }
    const QString dir = dataDir();
    if (dir.isEmpty()) p << tr("Dataset: choose the folder with the IDX files.");
    else if (!QFileInfo(dir).isDir())
        p << tr("Dataset: folder %1 does not exist%2.")
                 .arg(dir, m_source->currentIndex() == 0 ? tr(" (install the Debian package dataset-fashion-mnist, or set TRAINSTUDIO_FMNIST_DIR)") : QString());
    if (m_usePipeline->isChecked() && (m_flip->isChecked() || m_crop->isChecked()) && !m_imageInput)
        p << tr("Augmentation: random flip and crop need an image input; this model's input is flat.");
    if (m_usePipeline->isChecked()) {
        RunConfig c;
        c.dataDir = dir.toStdString();
        c.batchSize = m_batch->value();
        c.seed = static_cast<uint64_t>(m_seed->value());
        auto spec = PipelineSpec::fromJson(pipelineJson(c), "the run setup's pipeline");
        if (!spec.ok()) p << tr("Input pipeline: %1").arg(QString::fromStdString(spec.error().toString()));
        else if (isRemoteStrategy())
            if (const QString e = inputShardingProblem(m_cluster, strategy(), *spec); !e.isEmpty()) p << tr("Input sharding: %1").arg(e);
    }
    return p;
}

nlohmann::json RunSetupPanel::pipelineJson(const RunConfig& c) const
{
    const int par = m_parallelism->currentData().toInt();
    nlohmann::json t = nlohmann::json::array();
    // Augment the 8-bit image first, then normalise (the order tf.data tutorials use).
    if (m_flip->isChecked() && m_imageInput) t.push_back({{"op", "map"}, {"fn", "random_flip"}, {"num_parallel_calls", par}});
    if (m_crop->isChecked() && m_imageInput)
        t.push_back({{"op", "map"}, {"fn", "random_crop"}, {"size", {m_inputHeight, m_inputWidth}}, {"padding", 4}, {"num_parallel_calls", par}});
    t.push_back({{"op", "map"}, {"fn", "normalise"}, {"num_parallel_calls", par}});
    if (m_shuffle->isChecked()) t.push_back({{"op", "shuffle"}, {"buffer_size", m_shuffleBuffer->value()}, {"reshuffle_each_iteration", true}});
    t.push_back({{"op", "batch"}, {"size", c.batchSize}});
    if (const int pf = m_prefetch->currentData().toInt(); pf != 0) t.push_back({{"op", "prefetch"}, {"buffer_size", pf}});
    nlohmann::json src = {{"kind", "idx"}, {"dir", c.dataDir}, {"split", "train"}, {"layout", m_imageInput ? "image" : "flat"}};
    return {{"source", src}, {"transformations", t}, {"seed", c.seed}, {"auto_shard", m_autoShard->currentData().toString().toStdString()}};
}

RunConfig RunSetupPanel::config() const
{
    RunConfig c;
    c.model = m_model;
    c.dataDir = dataDir().toStdString();
    c.limit = m_limit->value();
    c.validate = m_validate->isChecked();
    c.shuffle = m_shuffle->isChecked();
    c.epochs = m_epochs->value();
    c.batchSize = m_batch->value();
    c.seed = static_cast<uint64_t>(m_seed->value());
    c.optimizer = m_model.compile.optimizer.is_object() ? m_model.compile.optimizer : nlohmann::json::object();
    c.optimizer["type"] = m_optimizer->currentText().toStdString();
    c.optimizer["learning_rate"] = m_lr->value();
    const QString schedule = m_schedule->currentData().toString();
    if (schedule == "cosine") {
        // decay_steps: the whole run, from the data size when it is known (Fashion-MNIST: 60000).
        const int64_t examples = c.limit > 0 ? c.limit : 60000;
        const int64_t steps = std::max<int64_t>(1, (examples + c.batchSize - 1) / c.batchSize * c.epochs);
        c.schedule = {{"type", "cosine"}, {"decay_steps", steps}};
    } else if (schedule == "step") {
        const int64_t examples = c.limit > 0 ? c.limit : 60000;
        c.schedule = {{"type", "step"}, {"step_size", std::max<int64_t>(1, (examples + c.batchSize - 1) / c.batchSize)}, {"gamma", 0.1}};
    }
    // The policy from the form; loss-scale settings from a loaded configuration stay.
    PrecisionConfig precision = m_precisionConfig;
    if (auto p = PrecisionConfig::parsePolicy(m_precision->currentData().toString().toStdString(), "the run setup"); p.ok())
        precision.policy = *p;
    // The model's own policy with default loss scaling is left unset, as the CLI leaves it: the
    // configuration stays what it was before models had a policy.
    if (precision.toJson() != PrecisionConfig{m_model.compile.precision}.toJson()) c.precision = precision;
    c.strategy.kind = strategy().toStdString();
    // Remote workers train on their own devices (cpu:0 each); the checklist is this machine's.
    for (const QString& d : isRemoteStrategy() ? QStringList() : checkedDevices()) {
        auto dev = Device::parse(d.toStdString());
        if (dev.ok()) c.strategy.devices.push_back(*dev);
    }
    if (c.strategy.kind == "one-device" && c.strategy.devices.size() > 1) c.strategy.devices.resize(1);
    c.strategy.threads = m_threads->value();
    if (c.strategy.kind == "parameter-server") {
        c.strategy.partition.policy = m_partitioner->currentData().toString().toStdString();
        c.strategy.partition.minShardBytes = int64_t{m_minShard->value()} << 10;
    }
    if (m_usePipeline->isChecked()) {
        auto spec = PipelineSpec::fromJson(pipelineJson(c), "the run setup's pipeline");
        if (spec.ok()) c.pipeline = std::move(spec).value();  // problems() reports the error
    }
    c.loadWeights = m_initialWeights->text().trimmed().toStdString();
    if (m_backup->isChecked()) {
        c.backup.dir = m_backupDir->text().trimmed().toStdString();
        c.backup.everySteps = m_backupEvery->value();
        c.backup.restarts = isRemoteStrategy() ? m_restarts->value() : 0;
    }
    return c;
}

void RunSetupPanel::setInitialWeights(const QString& path) { m_initialWeights->setText(path); }
QString RunSetupPanel::initialWeights() const { return m_initialWeights->text().trimmed(); }

void RunSetupPanel::setConfig(const RunConfig& c)
{
    if (!c.dataDir.empty() && c.dataDir != defaultDataDirectory().toStdString()) {
        m_source->setCurrentIndex(1);
        m_dataDir->setText(QString::fromStdString(c.dataDir));
    } else {
        m_source->setCurrentIndex(0);
    }
    m_limit->setValue(static_cast<int>(c.limit));
    m_validate->setChecked(c.validate);
    m_shuffle->setChecked(c.shuffle);
    if (c.epochs > 0) m_epochs->setValue(static_cast<int>(c.epochs));
    if (c.batchSize > 0) m_batch->setValue(static_cast<int>(c.batchSize));
    m_seed->setValue(static_cast<int>(c.seed));
    if (c.optimizer.is_object()) {
        const QString type = QString::fromStdString(c.optimizer.value("type", std::string("adam")));
        if (m_optimizer->findText(type) >= 0) m_optimizer->setCurrentText(type);
        m_lr->setValue(c.optimizer.value("learning_rate", m_lr->value()));
    }
    const std::string sched = c.schedule.is_object() ? c.schedule.value("type", std::string("constant")) : "constant";
    m_schedule->setCurrentIndex(std::max(0, m_schedule->findData(QString::fromStdString(sched))));
    // A configuration without one trains in the model's policy.
    m_precisionConfig = c.precision ? *c.precision : PrecisionConfig{m_model.compile.precision};
    m_precision->setCurrentIndex(std::max(0, m_precision->findData(QString(precisionPolicyName(m_precisionConfig.policy)))));
    setStrategy(QString::fromStdString(c.strategy.kind));
    QStringList devices;
    for (const auto& d : c.strategy.devices) devices << QString::fromStdString(d.toString());
    if (!devices.isEmpty()) setCheckedDevices(devices);
    m_threads->setValue(c.strategy.threads);
    m_partitioner->setCurrentIndex(std::max(0, m_partitioner->findData(QString::fromStdString(c.strategy.partition.policy))));
    m_minShard->setValue(static_cast<int>(std::clamp<int64_t>((c.strategy.partition.minShardBytes + 1023) >> 10, 1, m_minShard->maximum())));
    m_initialWeights->setText(QString::fromStdString(c.loadWeights));
    m_backup->setChecked(c.backup.enabled());
    m_backupDir->setText(QString::fromStdString(c.backup.dir));
    m_backupEvery->setValue(static_cast<int>(std::min<int64_t>(c.backup.everySteps, m_backupEvery->maximum())));
    m_restarts->setValue(c.backup.restarts);
    m_usePipeline->setChecked(c.pipeline.has_value());
    m_autoShard->setCurrentIndex(0);
    if (c.pipeline) {
        // Back from the pipeline's JSON to the form's few knobs.
        const nlohmann::json p = c.pipeline->toJson();
        m_flip->setChecked(false);
        m_crop->setChecked(false);
        m_shuffle->setChecked(false);
        m_prefetch->setCurrentIndex(m_prefetch->findData(0));
        m_autoShard->setCurrentIndex(std::max(0, m_autoShard->findData(QString::fromStdString(p.value("auto_shard", std::string("auto"))))));
        auto count = [](const nlohmann::json& v) { return v.is_number_integer() ? v.get<int>() : -1; };  // "AUTOTUNE"
        for (const auto& t : p.value("transformations", nlohmann::json::array())) {
            const std::string op = t.value("op", std::string()), fn = t.value("fn", std::string());
            if (op == "map" && fn == "random_flip") m_flip->setChecked(true);
            if (op == "map" && fn == "random_crop") m_crop->setChecked(true);
            if (op == "map" && fn == "normalise" && t.contains("num_parallel_calls"))
                m_parallelism->setCurrentIndex(std::max(0, m_parallelism->findData(count(t["num_parallel_calls"]))));
            if (op == "shuffle") {
                m_shuffle->setChecked(true);
                m_shuffleBuffer->setValue(t.value("buffer_size", m_shuffleBuffer->value()));
            }
            if (op == "prefetch" && t.contains("buffer_size"))
                m_prefetch->setCurrentIndex(std::max(0, m_prefetch->findData(count(t["buffer_size"]))));
        }
    }
    updateDerived();
}

RemoteSettings RunSetupPanel::remoteSettings() const
{
    RemoteSettings r;
    r.tfConfig = m_tfConfig->toPlainText();
    r.tokenFile = m_tokenFile->text().trimmed();
    r.tlsCa = m_tlsCa->text().trimmed();
    return r;
}

void RunSetupPanel::setRemoteSettings(const RemoteSettings& r)
{
    const QSignalBlocker b1(m_tfConfig), b2(m_tokenFile), b3(m_tlsCa);
    m_tfConfig->setPlainText(r.tfConfig);
    m_tokenFile->setText(r.tokenFile);
    m_tlsCa->setText(r.tlsCa);
    updateCluster();
}

bool RunSetupPanel::isRemoteStrategy() const
{
    const QString s = strategy();
    return s == QLatin1String("multi-worker-mirrored") || s == QLatin1String("parameter-server");
}

void RunSetupPanel::updateCluster()
{
    const RemoteSettings r = remoteSettings();
    if (m_persistent) {
        QSettings settings;
        settings.setValue("cluster/tfConfig", r.tfConfig);
        settings.setValue("cluster/tokenFile", r.tokenFile);
        settings.setValue("cluster/tlsCa", r.tlsCa);
    }
    m_cluster = summarizeCluster(r.tfConfig);
    // The strategies a cluster enables, each with the reason when it cannot.
    const QString noCluster = r.isEmpty() ? tr("needs remote workers: describe them in Remote workers (TF_CONFIG)") : m_cluster.error;
    const bool mwm = m_cluster.valid && m_cluster.chiefs + m_cluster.workers > 0 && m_cluster.ps == 0;
    setComboItemEnabled(m_strategy, 2, mwm,
                        m_cluster.valid ? tr("MultiWorkerMirrored needs chief/worker tasks and no ps tasks in the cluster") : noCluster);
    const bool psSupported = remoteStrategySupported(QStringLiteral("parameter-server"));
    const bool ps = m_cluster.valid && m_cluster.ps > 0 && m_cluster.workers > 0 && psSupported;
    setComboItemEnabled(m_strategy, 3, ps,
                        !psSupported ? tr("ParameterServer on remote workers is not available in this version")
                        : m_cluster.valid ? tr("ParameterServer needs ps and worker tasks in the cluster") : noCluster);
    // The table lists the tasks as written; Check workers fills in their state.
    m_workerTable->setRowCount(0);
    for (const QString& t : m_cluster.trainingTasks) {
        const int row = m_workerTable->rowCount();
        m_workerTable->insertRow(row);
        const int at = t.indexOf(QLatin1String(" at "));
        m_workerTable->setItem(row, 0, new QTableWidgetItem(t.left(at)));
        m_workerTable->setItem(row, 1, new QTableWidgetItem(t.mid(at + 4)));
        m_workerTable->setItem(row, 2, new QTableWidgetItem(tr("not checked")));
    }
    m_checkWorkers->setEnabled(m_cluster.valid && !m_probe->isRunning());
    m_clusterState->setText(r.isEmpty() ? tr("no cluster configured")
                            : m_cluster.valid ? tr("%n training task(s)", nullptr, static_cast<int>(m_cluster.trainingTasks.size())) +
                                                    (m_cluster.ps ? tr(", %n ps task(s)", nullptr, m_cluster.ps) : QString()) +
                                                    (m_cluster.evaluators == 0 ? QString() : tr(", an evaluator task"))
                                              : m_cluster.error);
    updateDerived();
}

QStringList RunSetupPanel::exportTfConfigsTo(const QString& dir)
{
    QString error;
    const QStringList written = exportTfConfigs(m_tfConfig->toPlainText(), dir, &error);
    if (written.isEmpty()) m_clusterState->setText(tr("Export: %1").arg(error));
    else
        m_clusterState->setText(tr("Wrote %n TF_CONFIG file(s) to %1; on each machine: trainstudio-cli train --tf-config FILE", nullptr,
                                   static_cast<int>(written.size()))
                                    .arg(QDir::toNativeSeparators(dir)));
    return written;
}

void RunSetupPanel::checkWorkers()
{
    QString error;
    const QString kind = isRemoteStrategy() ? strategy() : (m_cluster.ps > 0 ? QStringLiteral("parameter-server") : QStringLiteral("multi-worker-mirrored"));
    if (!m_probe->start(remoteSettings(), kind, 3000, &error)) {
        m_clusterState->setText(error);
        return;
    }
    m_checkWorkers->setEnabled(false);
    m_clusterState->setText(tr("checking %n worker(s)…", nullptr, m_workerTable->rowCount()));
}

void RunSetupPanel::showProbe(const QList<WorkerProbeResult>& results)
{
    int ok = 0;
    m_workerTable->setRowCount(0);
    for (const WorkerProbeResult& r : results) {
        const int row = m_workerTable->rowCount();
        m_workerTable->insertRow(row);
        m_workerTable->setItem(row, 0, new QTableWidgetItem(r.task));
        m_workerTable->setItem(row, 1, new QTableWidgetItem(r.address));
        auto* state = new QTableWidgetItem(r.ok ? tr("ready: %1").arg(r.detail) : r.problem);
        state->setToolTip(r.ok ? r.detail : r.problem + (r.hint.isEmpty() ? QString() : QStringLiteral("\n") + r.hint));
        state->setForeground(r.ok ? QColor(0x27, 0xae, 0x60) : QColor(0xc0, 0x39, 0x2b));
        m_workerTable->setItem(row, 2, state);
        ok += r.ok ? 1 : 0;
    }
    m_checkWorkers->setEnabled(m_cluster.valid);
    m_clusterState->setText(tr("%1 of %2 worker(s) ready").arg(ok).arg(results.size()));
}

void RunSetupPanel::refreshDeviceState()
{
    if (!isVisible() && m_hostLoad.hasBaseline()) return;
    // Live state: the host's load since the last refresh and its free memory. CPU devices are
    // logical (a share of the cores), so each shows the machine's load.
    const HostLoad h = m_hostLoad.read();
    const double load = h.load;
    const uint64_t memTotal = h.memoryTotal;
    const uint64_t memFree = h.memoryFree;
    const QSignalBlocker block(m_devices);
    for (int i = 0; i < m_devices->count(); ++i) {
        QListWidgetItem* item = m_devices->item(i);
        const QString id = item->data(Qt::UserRole).toString();
        const QString name = item->data(Qt::UserRole + 1).toString();
        QString text = tr("%1 · memory %2 free of %3").arg(name.isEmpty() ? id : name, bytesText(memFree), bytesText(memTotal));
        if (load >= 0) text += tr(" · load %1%").arg(100 * load, 0, 'f', 0);
        item->setText(text);
        item->setToolTip(text);
    }
}

} // namespace ts
