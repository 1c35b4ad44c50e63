#pragma once
// Inspector: edits what is selected. One layer: its name and every catalogue attribute with an
// editor that fits the attribute's kind (spin boxes with the catalogue's limits, combo boxes for
// enumerations, check boxes, h×w pairs, shape fields), the catalogue description as tooltip, a
// reset-to-default button, and the analysis: output shape, parameters, FLOPs and problems.
// Nothing selected: the model's name, compile settings and totals. Several layers: their totals.
// Every change is a document edit (undoable); the editors follow the document, not the reverse.

#include <QWidget>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

class QFormLayout;
class QLabel;
class QVBoxLayout;
class QToolButton;

namespace ts {

class ModelDocument;
struct AttrSpec;
struct DocumentDelta;

class Inspector : public QWidget {
    Q_OBJECT
public:
    explicit Inspector(ModelDocument* doc, QWidget* parent = nullptr);

    void setSelection(const std::vector<std::string>& ids);
    const std::string& inspectedId() const { return m_id; }
    // The editor of an attribute of the inspected layer (objectName "attr_<name>"), or null.
    QWidget* editor(const std::string& attr) const;

Q_SIGNALS:
    void message(const QString& text);

private:
    struct AttrRow {
        const AttrSpec* spec = nullptr;
        QWidget* editor = nullptr;
        QToolButton* reset = nullptr;
        QLabel* label = nullptr;
        // Shows a value without emitting; `effective` is what the analysis made of it (the
        // window a null pooling stride takes).
        std::function<void(const nlohmann::json& value, const nlohmann::json& effective)> setValue;
    };

    void rebuild();
    void clearPage();
    void buildLayerPage();
    void buildModelPage();
    void buildMultiPage();
    void refreshValues();
    void refreshAnalysis();
    void onLayersChanged(const DocumentDelta& delta);
    QWidget* makeEditor(const AttrSpec& spec, AttrRow& row);
    void commit(const std::string& attr, const nlohmann::json& value);
    QLabel* sectionLabel(const QString& text);

    ModelDocument* m_doc;
    std::vector<std::string> m_selection;
    std::string m_id;  // the inspected layer (single selection), else empty
    QWidget* m_page = nullptr;
    QVBoxLayout* m_pageLayout = nullptr;
    std::map<std::string, AttrRow> m_rows;
    // Labels and fields refreshed from the analysis / header.
    QLabel* m_info = nullptr;
    QLabel* m_problems = nullptr;
    std::vector<std::function<void()>> m_refreshers;
};

} // namespace ts
