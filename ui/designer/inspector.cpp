#include "designer/inspector.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QRegularExpressionValidator>
#include <QScrollArea>
#include <QSpinBox>
#include <QStyle>
#include <QToolButton>
#include <QVBoxLayout>

#include <climits>
#include <cmath>

#include "designer/format.h"
#include "designer/modeldocument.h"
#include "designer/theme.h"
#include "model/spec.h"

namespace ts {

using nlohmann::json;

namespace {

// Shows values the short way ("0.001", "0.5") instead of a fixed number of decimals.
class CompactDoubleSpinBox : public QDoubleSpinBox {
public:
    explicit CompactDoubleSpinBox(QWidget* parent = nullptr) : QDoubleSpinBox(parent)
    {
        setDecimals(10);
    }
    QString textFromValue(double value) const override
    {
        return QString::number(value, 'g', 8);
    }
};

QString valueText(const json& v)
{
    if (v.is_null())
        return QObject::tr("automatic");
    if (v.is_string())
        return toQString(v.get<std::string>());
    return toQString(v.dump());
}

QString attrTooltip(const AttrSpec& a)
{
    QString tip = QStringLiteral("<b>%1</b>: %2").arg(toQString(a.name), toQString(a.description).toHtmlEscaped());
    tip += QStringLiteral("<br>default: %1").arg(valueText(a.defaultValue).toHtmlEscaped());
    if (a.kind == "int" || a.kind == "float" || a.kind == "ints") {
        if (a.max > 0)
            tip += QStringLiteral("<br>range: %1 to %2").arg(a.min).arg(a.max);
        else if (a.min != 0)
            tip += QStringLiteral("<br>at least %1").arg(a.min);
    }
    if (a.required)
        tip += QStringLiteral("<br>required by Keras (the default is a suggestion)");
    return tip;
}

std::vector<int64_t> parseDims(const QString& text)
{
    std::vector<int64_t> dims;
    QString t = text;
    t.replace(QChar(0x00D7), QLatin1Char(',')).replace(QLatin1Char('x'), QLatin1Char(','));
    for (const QString& part : t.split(QLatin1Char(','), Qt::SkipEmptyParts)) {
        bool ok = false;
        const qlonglong v = part.trimmed().toLongLong(&ok);
        if (ok)
            dims.push_back(v);
    }
    return dims;
}

QString dimsToText(const json& v)
{
    if (!v.is_array())
        return v.is_null() ? QString() : toQString(v.dump());
    QStringList parts;
    for (const json& d : v)
        parts << toQString(d.dump());
    return parts.join(QStringLiteral(", "));
}

// Shows a value in an editor without it reporting an edit back to the document.
template <typename W, typename Setter, typename V>
void setQuietly(W* w, Setter setter, const V& value)
{
    const QSignalBlocker blocker(w);
    (w->*setter)(value);
}

const std::vector<std::string> kOptimizers = {"adam", "adamw", "sgd", "rmsprop"};
const std::vector<std::string> kLosses = {"sparse_categorical_crossentropy",
                                          "categorical_crossentropy", "binary_crossentropy",
                                          "mean_squared_error"};

} // namespace

Inspector::Inspector(ModelDocument* doc, QWidget* parent) : QWidget(parent), m_doc(doc)
{
    auto* scroll = new QScrollArea(this);
    scroll->setWidgetResizable(true);
    scroll->setFrameShape(QFrame::NoFrame);
    scroll->setObjectName(QStringLiteral("inspectorScroll"));
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(scroll);
    connect(doc, &ModelDocument::modelReset, this, [this] { setSelection({}); });
    connect(doc, &ModelDocument::layersChanged, this, &Inspector::onLayersChanged);
    connect(doc, &ModelDocument::analysisUpdated, this, &Inspector::refreshAnalysis);
    connect(doc, &ModelDocument::headerChanged, this, [this] {
        if (m_selection.empty())
            refreshValues();
    });
    rebuild();
}

QWidget* Inspector::editor(const std::string& attr) const
{
    auto it = m_rows.find(attr);
    return it == m_rows.end() ? nullptr : it->second.editor;
}

void Inspector::setSelection(const std::vector<std::string>& ids)
{
    if (ids == m_selection && m_page)
        return;
    m_selection = ids;
    rebuild();
}

void Inspector::onLayersChanged(const DocumentDelta& delta)
{
    bool structure = false;
    for (const auto& [from, to] : delta.renamed)
        for (std::string& id : m_selection)
            if (id == from) {
                id = to;
                if (m_id == from)
                    m_id = to;
            }
    for (const std::string& id : delta.removed)
        if (std::find(m_selection.begin(), m_selection.end(), id) != m_selection.end())
            structure = true;
    if (structure) {
        std::vector<std::string> keep;
        for (const std::string& id : m_selection)
            if (m_doc->contains(id))
                keep.push_back(id);
        m_selection = keep;
        rebuild();
        return;
    }
    if (!m_id.empty())
        refreshValues();
}

QLabel* Inspector::sectionLabel(const QString& text)
{
    auto* l = new QLabel(text, m_page);
    QFont f = l->font();
    f.setBold(true);
    l->setFont(f);
    l->setContentsMargins(0, 8, 0, 2);
    return l;
}

void Inspector::clearPage()
{
    m_rows.clear();
    m_refreshers.clear();
    m_info = nullptr;
    m_problems = nullptr;
    auto* scroll = findChild<QScrollArea*>(QStringLiteral("inspectorScroll"));
    m_page = new QWidget;
    m_page->setObjectName(QStringLiteral("inspectorPage"));
    m_pageLayout = new QVBoxLayout(m_page);
    m_pageLayout->setContentsMargins(10, 8, 10, 8);
    m_pageLayout->setSpacing(4);
    scroll->setWidget(m_page);  // deletes the previous page
}

void Inspector::rebuild()
{
    clearPage();
    m_id = m_selection.size() == 1 ? m_selection.front() : std::string();
    if (!m_id.empty() && m_doc->layer(m_id))
        buildLayerPage();
    else if (m_selection.size() > 1)
        buildMultiPage();
    else {
        m_id.clear();
        buildModelPage();
    }
    m_pageLayout->addStretch(1);
    refreshValues();
    refreshAnalysis();
}

// ---- one layer -------------------------------------------------------------------------------

QWidget* Inspector::makeEditor(const AttrSpec& a, AttrRow& row)
{
    const std::string name = a.name;
    const QString objectName = QStringLiteral("attr_") + toQString(name);
    QWidget* editor = nullptr;
    if (a.kind == "int") {
        auto* spin = new QSpinBox(m_page);
        const double def = a.defaultValue.is_number() ? a.defaultValue.get<double>() : a.min;
        spin->setRange(static_cast<int>(std::min(a.min, def)), a.max > 0 ? static_cast<int>(a.max) : INT_MAX / 2);
        spin->setKeyboardTracking(true);
        spin->setAccelerated(true);
        connect(spin, &QSpinBox::valueChanged, this, [this, name](int v) { commit(name, v); });
        row.setValue = [spin](const json& v, const json&) {
            if (v.is_number() && spin->value() != v.get<int>())
                setQuietly(spin, &QSpinBox::setValue, v.get<int>());
        };
        editor = spin;
    } else if (a.kind == "float") {
        auto* spin = new CompactDoubleSpinBox(m_page);
        spin->setRange(a.min, a.max > 0 ? a.max : 1e9);
        const double def = a.defaultValue.is_number() ? std::abs(a.defaultValue.get<double>()) : 0.0;
        spin->setSingleStep(def > 0 ? std::pow(10.0, std::floor(std::log10(def)) - 1) * 5 : 0.1);
        spin->setKeyboardTracking(true);
        connect(spin, &QDoubleSpinBox::valueChanged, this, [this, name](double v) { commit(name, v); });
        row.setValue = [spin](const json& v, const json&) {
            if (v.is_number() && spin->value() != v.get<double>())
                setQuietly(spin, &QDoubleSpinBox::setValue, v.get<double>());
        };
        editor = spin;
    } else if (a.kind == "bool") {
        auto* check = new QCheckBox(m_page);
        connect(check, &QCheckBox::toggled, this, [this, name](bool v) { commit(name, v); });
        row.setValue = [check](const json& v, const json&) {
            if (v.is_boolean() && check->isChecked() != v.get<bool>())
                setQuietly(check, &QCheckBox::setChecked, v.get<bool>());
        };
        editor = check;
    } else if (a.kind == "enum") {
        auto* combo = new QComboBox(m_page);
        for (const std::string& c : a.choices)
            combo->addItem(toQString(c));
        connect(combo, &QComboBox::currentTextChanged, this,
                [this, name](const QString& v) { commit(name, toStdString(v)); });
        row.setValue = [combo](const json& v, const json&) {
            const QString text = v.is_string() ? toQString(v.get<std::string>()) : toQString(v.dump());
            if (combo->findText(text) < 0) {
                const QSignalBlocker blocker(combo);
                combo->addItem(text);  // a value from a file that the catalogue does not list
            }
            if (combo->currentText() != text)
                setQuietly(combo, &QComboBox::setCurrentIndex, combo->findText(text));
        };
        editor = combo;
    } else if (a.kind == "ints") {
        // (height, width): two spin boxes; "auto" where the default is computed (strides).
        auto* box = new QWidget(m_page);
        auto* h = new QHBoxLayout(box);
        h->setContentsMargins(0, 0, 0, 0);
        h->setSpacing(4);
        QCheckBox* autoBox = nullptr;
        if (a.defaultValue.is_null()) {
            autoBox = new QCheckBox(tr("auto"), box);
            autoBox->setObjectName(objectName + QStringLiteral("_auto"));
            autoBox->setToolTip(toQString(a.description));
            h->addWidget(autoBox);
        }
        auto* sh = new QSpinBox(box);
        auto* sw = new QSpinBox(box);
        sh->setObjectName(objectName + QStringLiteral("_h"));
        sw->setObjectName(objectName + QStringLiteral("_w"));
        for (QSpinBox* s : {sh, sw}) {
            s->setRange(std::max(1, static_cast<int>(a.min)), a.max > 0 ? static_cast<int>(a.max) : 4096);
            s->setKeyboardTracking(true);
        }
        h->addWidget(sh, 1);
        h->addWidget(new QLabel(QStringLiteral("×"), box));
        h->addWidget(sw, 1);
        auto emitValue = [this, name, sh, sw, autoBox] {
            if (autoBox && autoBox->isChecked())
                commit(name, nullptr);
            else
                commit(name, json::array({sh->value(), sw->value()}));
        };
        connect(sh, &QSpinBox::valueChanged, this, emitValue);
        connect(sw, &QSpinBox::valueChanged, this, emitValue);
        if (autoBox)
            connect(autoBox, &QCheckBox::toggled, this, [emitValue, sh, sw](bool on) {
                sh->setEnabled(!on);
                sw->setEnabled(!on);
                emitValue();
            });
        row.setValue = [sh, sw, autoBox](const json& value, const json& effective) {
            int a = 1, b = 1;
            const bool isAuto = value.is_null();
            // "auto" shows what it amounts to, so unticking starts from there.
            const json& v = isAuto ? effective : value;
            if (v.is_number_integer())
                a = b = v.get<int>();
            else if (v.is_array() && v.size() == 1 && v[0].is_number_integer())
                a = b = v[0].get<int>();
            else if (v.is_array() && v.size() >= 2 && v[0].is_number_integer() && v[1].is_number_integer()) {
                a = v[0].get<int>();
                b = v[1].get<int>();
            }
            if (autoBox) {
                setQuietly(autoBox, &QCheckBox::setChecked, isAuto);
                sh->setEnabled(!isAuto);
                sw->setEnabled(!isAuto);
            }
            if (sh->value() != a)
                setQuietly(sh, &QSpinBox::setValue, a);
            if (sw->value() != b)
                setQuietly(sw, &QSpinBox::setValue, b);
        };
        editor = box;
    } else {
        // "shape": a list of integers typed as "28, 28, 1"; applied as soon as it parses.
        auto* edit = new QLineEdit(m_page);
        edit->setPlaceholderText(tr("e.g. 28, 28, 1"));
        edit->setValidator(new QRegularExpressionValidator(
            QRegularExpression(QStringLiteral("^\\s*-?\\d+(\\s*[,x×]\\s*-?\\d+)*\\s*$")), edit));
        connect(edit, &QLineEdit::textEdited, this, [this, name, edit](const QString& text) {
            if (!edit->hasAcceptableInput())
                return;
            json dims = json::array();
            for (int64_t d : parseDims(text))
                dims.push_back(d);
            commit(name, dims);
        });
        row.setValue = [edit](const json& v, const json&) {
            // Leave the text being typed alone when it already means this value.
            json current = json::array();
            for (int64_t d : parseDims(edit->text()))
                current.push_back(d);
            if (current != v || edit->text().isEmpty())
                setQuietly(edit, &QLineEdit::setText, dimsToText(v));
        };
        editor = edit;
    }
    editor->setObjectName(objectName);
    editor->setToolTip(attrTooltip(a));
    return editor;
}

void Inspector::commit(const std::string& attr, const json& value)
{
    if (m_id.empty())
        return;
    json v = value;
    auto it = m_rows.find(attr);
    // Keras has no default for a required attribute: "reset" writes the suggestion instead.
    if (v.is_null() && it != m_rows.end() && it->second.spec && it->second.spec->required)
        v = it->second.spec->defaultValue;
    m_doc->setAttribute(m_id, attr, v);
}

void Inspector::buildLayerPage()
{
    const LayerSpec* l = m_doc->layer(m_id);
    const LayerKind* kind = findLayerKind(l->type);

    auto* title = new QLabel(m_page);
    title->setObjectName(QStringLiteral("inspectorTitle"));
    QFont tf = title->font();
    tf.setBold(true);
    tf.setPointSizeF(tf.pointSizeF() * 1.2);
    title->setFont(tf);
    title->setText(toQString(l->type));
    auto* head = new QHBoxLayout;
    auto* icon = new QLabel(m_page);
    icon->setPixmap(groupIcon(kind ? kind->group : std::string()).pixmap(QSize(22, 22)));
    head->addWidget(icon);
    head->addWidget(title, 1);
    m_pageLayout->addLayout(head);
    auto* desc = new QLabel(kind ? toQString(kind->description) : tr("Unknown layer type: not in the catalogue"), m_page);
    desc->setWordWrap(true);
    desc->setForegroundRole(QPalette::PlaceholderText);
    m_pageLayout->addWidget(desc);

    auto* form = new QFormLayout;
    form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    form->setLabelAlignment(Qt::AlignLeft);
    auto* name = new QLineEdit(m_page);
    name->setObjectName(QStringLiteral("layerName"));
    name->setToolTip(tr("The layer's name: also its Keras name and the prefix of its weights"));
    name->setValidator(new QRegularExpressionValidator(QRegularExpression(QStringLiteral("[A-Za-z0-9_.\\-]+")), name));
    connect(name, &QLineEdit::editingFinished, this, [this, name] {
        const std::string newId = toStdString(name->text().trimmed());
        if (newId == m_id)
            return;
        QString why;
        if (!m_doc->renameLayer(m_id, newId, &why)) {
            Q_EMIT message(tr("Cannot rename '%1': %2").arg(toQString(m_id), why));
            name->setText(toQString(m_id));
        }
    });
    m_refreshers.push_back([this, name] {
        if (!name->hasFocus() || name->text() == toQString(m_id))
            name->setText(toQString(m_id));
    });
    form->addRow(tr("Name"), name);
    auto* inputs = new QLabel(m_page);
    inputs->setObjectName(QStringLiteral("layerInputs"));
    inputs->setWordWrap(true);
    m_refreshers.push_back([this, inputs] {
        const LayerSpec* l = m_doc->layer(m_id);
        QStringList names;
        if (l)
            for (const std::string& in : l->inputs)
                names << toQString(in);
        inputs->setText(names.isEmpty() ? tr("none") : names.join(QStringLiteral(", ")));
    });
    if (!kind || kind->maxInputs != 0)
        form->addRow(tr("Inputs"), inputs);
    m_pageLayout->addLayout(form);

    if (kind && !kind->attrs.empty()) {
        m_pageLayout->addWidget(sectionLabel(tr("Attributes")));
        auto* attrs = new QFormLayout;
        attrs->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
        for (const AttrSpec& a : kind->attrs) {
            AttrRow row;
            row.spec = &a;
            row.editor = makeEditor(a, row);
            row.label = new QLabel(toQString(a.name), m_page);
            row.label->setToolTip(attrTooltip(a));
            row.reset = new QToolButton(m_page);
            row.reset->setObjectName(QStringLiteral("reset_") + toQString(a.name));
            row.reset->setText(QStringLiteral("↺"));
            row.reset->setAutoRaise(true);
            row.reset->setToolTip(tr("Reset to the default (%1)").arg(valueText(a.defaultValue)));
            const std::string attrName = a.name;
            connect(row.reset, &QToolButton::clicked, this, [this, attrName] { commit(attrName, nullptr); });
            auto* field = new QHBoxLayout;
            field->setSpacing(2);
            field->addWidget(row.editor, 1);
            field->addWidget(row.reset);
            attrs->addRow(row.label, field);
            m_rows.emplace(a.name, row);
        }
        m_pageLayout->addLayout(attrs);
    } else if (kind) {
        auto* none = new QLabel(tr("No attributes"), m_page);
        none->setForegroundRole(QPalette::PlaceholderText);
        m_pageLayout->addWidget(none);
    }

    // Attributes the catalogue does not know (hand-written files): shown with a remove button.
    auto* unknownBox = new QVBoxLayout;
    m_pageLayout->addLayout(unknownBox);
    const std::string id = m_id;
    if (l->attrs.is_object())
        for (auto it = l->attrs.begin(); it != l->attrs.end(); ++it) {
            if (m_rows.count(it.key()))
                continue;
            auto* line = new QHBoxLayout;
            auto* label = new QLabel(QStringLiteral("%1 = %2").arg(toQString(it.key()), toQString(it.value().dump())), m_page);
            label->setToolTip(tr("Not an attribute of %1; remove it").arg(toQString(l->type)));
            auto* remove = new QToolButton(m_page);
            remove->setText(QStringLiteral("✕"));
            remove->setAutoRaise(true);
            remove->setToolTip(tr("Remove this attribute"));
            const std::string key = it.key();
            connect(remove, &QToolButton::clicked, this, [this, id, key] { m_doc->setAttribute(id, key, nullptr); });
            line->addWidget(label, 1);
            line->addWidget(remove);
            unknownBox->addLayout(line);
        }

    m_pageLayout->addWidget(sectionLabel(tr("Analysis")));
    m_info = new QLabel(m_page);
    m_info->setObjectName(QStringLiteral("layerInfo"));
    m_info->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_info->setWordWrap(true);
    m_pageLayout->addWidget(m_info);
    m_problems = new QLabel(m_page);
    m_problems->setObjectName(QStringLiteral("layerProblems"));
    m_problems->setWordWrap(true);
    m_problems->setTextFormat(Qt::RichText);
    m_pageLayout->addWidget(m_problems);
}

// ---- nothing selected: the model ------------------------------------------------------------

void Inspector::buildModelPage()
{
    auto* title = new QLabel(tr("Model"), m_page);
    QFont tf = title->font();
    tf.setBold(true);
    tf.setPointSizeF(tf.pointSizeF() * 1.2);
    title->setFont(tf);
    m_pageLayout->addWidget(title);
    auto* hint = new QLabel(tr("Select a layer to edit it. These settings apply to the whole model "
                               "and to training."), m_page);
    hint->setWordWrap(true);
    hint->setForegroundRole(QPalette::PlaceholderText);
    m_pageLayout->addWidget(hint);

    auto* form = new QFormLayout;
    form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    auto* name = new QLineEdit(m_page);
    name->setObjectName(QStringLiteral("modelName"));
    connect(name, &QLineEdit::editingFinished, this, [this, name] {
        ModelHeader h = m_doc->header();
        const std::string v = toStdString(name->text().trimmed());
        if (v.empty() || v == h.name) {
            name->setText(toQString(h.name));
            return;
        }
        h.name = v;
        m_doc->setHeader(h, tr("Rename model to '%1'").arg(toQString(v)));
    });
    m_refreshers.push_back([this, name] {
        if (!name->hasFocus())
            name->setText(toQString(m_doc->spec().name));
    });
    form->addRow(tr("Name"), name);
    m_pageLayout->addLayout(form);

    m_pageLayout->addWidget(sectionLabel(tr("Training")));
    auto* train = new QFormLayout;
    train->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);

    auto* optimizer = new QComboBox(m_page);
    optimizer->setObjectName(QStringLiteral("optimizer"));
    for (const std::string& o : kOptimizers)
        optimizer->addItem(toQString(o));
    optimizer->setToolTip(tr("The optimizer (Keras names); its settings besides the learning rate "
                             "are Keras' defaults unless the file sets them"));
    connect(optimizer, &QComboBox::currentTextChanged, this, [this](const QString& v) {
        ModelHeader h = m_doc->header();
        json o = h.compile.optimizer.is_object() ? h.compile.optimizer : json::object();
        if (o.value("type", std::string()) == toStdString(v))
            return;
        // Keys of one optimizer are errors for another; keep only the learning rate.
        json next = {{"type", toStdString(v)}};
        if (o.contains("learning_rate"))
            next["learning_rate"] = o["learning_rate"];
        h.compile.optimizer = next;
        m_doc->setHeader(h, tr("Optimizer: %1").arg(v));
    });
    m_refreshers.push_back([this, optimizer] {
        const json& o = m_doc->spec().compile.optimizer;
        const QString t = toQString(o.is_object() ? o.value("type", std::string("adam")) : std::string("adam"));
        if (optimizer->findText(t) < 0) {
            const QSignalBlocker b(optimizer);
            optimizer->addItem(t);
        }
        setQuietly(optimizer, &QComboBox::setCurrentIndex, optimizer->findText(t));
    });
    train->addRow(tr("Optimizer"), optimizer);

    auto* lr = new CompactDoubleSpinBox(m_page);
    lr->setObjectName(QStringLiteral("learningRate"));
    lr->setRange(1e-8, 10);
    lr->setSingleStep(1e-4);
    lr->setToolTip(tr("Learning rate (Keras learning_rate)"));
    connect(lr, &QDoubleSpinBox::valueChanged, this, [this](double v) {
        ModelHeader h = m_doc->header();
        if (!h.compile.optimizer.is_object())
            h.compile.optimizer = json{{"type", "adam"}};
        h.compile.optimizer["learning_rate"] = v;
        m_doc->setHeader(h, tr("Learning rate = %1").arg(v), "learning_rate");
    });
    m_refreshers.push_back([this, lr] {
        const json& o = m_doc->spec().compile.optimizer;
        const double v = o.is_object() && o.contains("learning_rate") && o["learning_rate"].is_number()
                             ? o["learning_rate"].get<double>() : 1e-3;
        if (lr->value() != v)
            setQuietly(lr, &QDoubleSpinBox::setValue, v);
    });
    train->addRow(tr("Learning rate"), lr);

    auto* loss = new QComboBox(m_page);
    loss->setObjectName(QStringLiteral("loss"));
    for (const std::string& l : kLosses)
        loss->addItem(toQString(l));
    connect(loss, &QComboBox::currentTextChanged, this, [this](const QString& v) {
        ModelHeader h = m_doc->header();
        h.compile.loss = toStdString(v);
        m_doc->setHeader(h, tr("Loss: %1").arg(v));
    });
    m_refreshers.push_back([this, loss] {
        const QString t = toQString(m_doc->spec().compile.loss);
        if (loss->findText(t) < 0) {
            const QSignalBlocker b(loss);
            loss->addItem(t);
        }
        setQuietly(loss, &QComboBox::setCurrentIndex, loss->findText(t));
    });
    train->addRow(tr("Loss"), loss);

    auto* logits = new QCheckBox(tr("outputs are logits"), m_page);
    logits->setObjectName(QStringLiteral("fromLogits"));
    logits->setToolTip(tr("Keras from_logits: the model's output has no softmax/sigmoid"));
    connect(logits, &QCheckBox::toggled, this, [this](bool on) {
        ModelHeader h = m_doc->header();
        h.compile.fromLogits = on;
        m_doc->setHeader(h, on ? tr("Loss from logits") : tr("Loss from probabilities"));
    });
    m_refreshers.push_back([this, logits] {
        setQuietly(logits, &QCheckBox::setChecked, m_doc->spec().compile.fromLogits);
    });
    train->addRow(QString(), logits);

    // Keras' dtype policy of the model: the precision its runs train in unless they name one.
    auto* precision = new QComboBox(m_page);
    precision->setObjectName(QStringLiteral("precision"));
    for (const PrecisionPolicy p : {PrecisionPolicy::Float32, PrecisionPolicy::MixedBfloat16, PrecisionPolicy::MixedFloat16})
        precision->addItem(QString::fromLatin1(precisionPolicyName(p)), static_cast<int>(p));
    precision->setToolTip(tr("Keras' mixed-precision policy of the model: dense and convolution layers compute in 16 bits, "
                             "weights stay float32 (a layer's dtype \"float32\" keeps it in full precision). A run uses it "
                             "unless its setup names another precision."));
    connect(precision, &QComboBox::currentIndexChanged, this, [this, precision](int) {
        ModelHeader h = m_doc->header();
        const auto p = static_cast<PrecisionPolicy>(precision->currentData().toInt());
        if (h.compile.precision == p)
            return;
        h.compile.precision = p;
        m_doc->setHeader(h, tr("Precision: %1").arg(QString::fromLatin1(precisionPolicyName(p))));
    });
    m_refreshers.push_back([this, precision] {
        setQuietly(precision, &QComboBox::setCurrentIndex, precision->findData(static_cast<int>(m_doc->spec().compile.precision)));
    });
    train->addRow(tr("Precision"), precision);

    auto intField = [&](const char* object, const QString& label, int max, const std::string& key,
                        int64_t CompileSpec::*member, const QString& tip) {
        auto* spin = new QSpinBox(m_page);
        spin->setObjectName(QLatin1String(object));
        spin->setRange(1, max);
        spin->setToolTip(tip);
        connect(spin, &QSpinBox::valueChanged, this, [this, member, key, label](int v) {
            ModelHeader h = m_doc->header();
            h.compile.*member = v;
            m_doc->setHeader(h, QStringLiteral("%1 = %2").arg(label).arg(v), key);
        });
        m_refreshers.push_back([this, spin, member] {
            const int v = static_cast<int>(m_doc->spec().compile.*member);
            if (spin->value() != v)
                setQuietly(spin, &QSpinBox::setValue, v);
        });
        train->addRow(label, spin);
    };
    intField("batchSize", tr("Batch size"), 1 << 20, "batch_size", &CompileSpec::batchSize,
             tr("The global batch (split across replicas when training on several devices)"));
    intField("epochs", tr("Epochs"), 100000, "epochs", &CompileSpec::epochs, tr("Passes over the training data"));
    m_pageLayout->addLayout(train);

    m_pageLayout->addWidget(sectionLabel(tr("Totals")));
    m_info = new QLabel(m_page);
    m_info->setObjectName(QStringLiteral("modelInfo"));
    m_info->setWordWrap(true);
    m_info->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_pageLayout->addWidget(m_info);
    m_problems = new QLabel(m_page);
    m_problems->setObjectName(QStringLiteral("modelProblems"));
    m_problems->setWordWrap(true);
    m_problems->setTextFormat(Qt::RichText);
    m_pageLayout->addWidget(m_problems);
}

void Inspector::buildMultiPage()
{
    auto* title = new QLabel(tr("%1 layers selected").arg(m_selection.size()), m_page);
    QFont tf = title->font();
    tf.setBold(true);
    tf.setPointSizeF(tf.pointSizeF() * 1.2);
    title->setFont(tf);
    m_pageLayout->addWidget(title);
    m_info = new QLabel(m_page);
    m_info->setObjectName(QStringLiteral("selectionInfo"));
    m_info->setWordWrap(true);
    m_pageLayout->addWidget(m_info);
}

// ---- refreshing from the document ------------------------------------------------------------

void Inspector::refreshValues()
{
    for (const auto& r : m_refreshers)
        r();
    const LayerSpec* l = m_id.empty() ? nullptr : m_doc->layer(m_id);
    if (!l)
        return;
    const NodeInfo* info = m_doc->analysisPending() ? nullptr : m_doc->nodeInfo(m_id);
    for (auto& [name, row] : m_rows) {
        const bool set = l->attrs.is_object() && l->attrs.contains(name);
        const json value = set ? l->attrs[name] : row.spec->defaultValue;
        const json effective = info && info->attrs.contains(name) ? info->attrs[name] : value;
        if (row.setValue)
            row.setValue(value, effective);
        row.reset->setEnabled(set && value != row.spec->defaultValue);
        // Values that differ from the default stand out.
        QFont f = row.label->font();
        f.setBold(set && value != row.spec->defaultValue);
        row.label->setFont(f);
    }
}

void Inspector::refreshAnalysis()
{
    if (!m_id.empty())
        refreshValues();
    if (!m_info)
        return;
    const QString errorColor = isDarkPalette(palette()) ? QStringLiteral("#f87171") : QStringLiteral("#dc2626");
    auto problemHtml = [&](const std::vector<const Problem*>& problems) {
        QStringList items;
        for (const Problem* p : problems)
            items << QStringLiteral("<p style='color:%1'>⚠ %2%3</p>")
                         .arg(errorColor, toQString(p->message).toHtmlEscaped(),
                              p->hint.empty() ? QString()
                                              : QStringLiteral("<br><i>%1</i>").arg(toQString(p->hint).toHtmlEscaped()));
        return items.join(QString());
    };
    if (!m_id.empty()) {
        const NodeInfo* n = m_doc->nodeInfo(m_id);
        QStringList lines;
        if (n && n->ok) {
            QStringList ins;
            for (const Shape& s : n->inputShapes)
                ins << shapeText(s);
            if (!ins.isEmpty())
                lines << tr("Input: %1").arg(ins.join(QStringLiteral(", ")));
            lines << tr("Output: %1").arg(shapeText(n->outputShape));
            int64_t trainable = 0;
            for (const ParamSpec& p : n->params)
                if (p.trainable)
                    trainable += p.shape.numel();
            lines << (n->paramCount == trainable
                          ? tr("Parameters: %1").arg(exactCount(n->paramCount))
                          : tr("Parameters: %1 (%2 trainable)").arg(exactCount(n->paramCount), exactCount(trainable)));
            for (const ParamSpec& p : n->params)
                lines << QStringLiteral("  %1 %2").arg(toQString(p.name), shapeText(p.shape));
            lines << tr("FLOPs per sample: %1").arg(exactCount(n->flops));
        } else {
            lines << tr("Output: unknown until the problems are fixed");
        }
        m_info->setText(lines.join(QLatin1Char('\n')));
        m_problems->setText(problemHtml(m_doc->problemsOf(m_id)));
        m_problems->setVisible(!m_problems->text().isEmpty());
        return;
    }
    const GraphAnalysis& a = m_doc->analysis();
    if (m_selection.size() > 1) {
        int64_t params = 0, flops = 0;
        for (const std::string& id : m_selection)
            if (const NodeInfo* n = m_doc->nodeInfo(id)) {
                params += n->paramCount;
                flops += n->flops;
            }
        m_info->setText(tr("Parameters: %1\nFLOPs per sample: %2").arg(exactCount(params), exactCount(flops)));
        return;
    }
    m_info->setText(counted(static_cast<int64_t>(m_doc->spec().layers.size()), "layer", "layers")
                    + QLatin1Char('\n')
                    + tr("Parameters: %1 (%2 trainable)").arg(exactCount(a.totalParams), exactCount(a.trainableParams))
                    + QLatin1Char('\n') + tr("FLOPs per sample: %1").arg(exactCount(a.totalFlops)));
    if (m_problems) {
        std::vector<const Problem*> modelLevel;
        for (const Problem& p : a.problems)
            if (p.nodeId.empty())
                modelLevel.push_back(&p);
        QString html = problemHtml(modelLevel);
        const std::size_t onNodes = a.problems.size() - modelLevel.size();
        if (onNodes > 0)
            html += QStringLiteral("<p style='color:%1'>%2</p>")
                        .arg(errorColor, tr("%1 on layers (marked red on the canvas)")
                                            .arg(counted(static_cast<int64_t>(onNodes), "problem", "problems")));
        m_problems->setText(html);
        m_problems->setVisible(!html.isEmpty());
    }
}

} // namespace ts
