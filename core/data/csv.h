#pragma once
// CSV files with a header line: numeric feature columns and one label column chosen by name.
// Fields are separated by a one-character delimiter; fields may be quoted ("..." with "" for a
// quote) but may not span lines. Blank lines are skipped. Every error names the file, the
// 1-based line and column and, for a bad value, the column's name and the text found.

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace ts {

struct CsvOptions {
    std::string labelColumn = "label";
    std::vector<std::string> featureColumns;  // empty: every column except the label, in file order
    char delimiter = ',';
    bool floatLabels = false;                 // false: labels must be integers >= 0 (class ids)
};

struct CsvRecord {
    std::vector<float> features;
    float label = 0;       // an integral value unless floatLabels
    int64_t line = 0;      // 1-based line in the file
};

class CsvReader {
public:
    ~CsvReader();
    CsvReader(const CsvReader&) = delete;
    CsvReader& operator=(const CsvReader&) = delete;

    // Opens the file and reads its header. NotFound / IoError for the file, ParseError for an
    // empty file, a missing label or feature column, or a duplicated column name.
    static Result<std::unique_ptr<CsvReader>> open(const std::string& path, const CsvOptions& options);

    // The next record, std::nullopt at the end of the file. A ragged row, an empty field or a
    // value that is not a number gives a ParseError naming file, line and column; reading may
    // continue with the next line after an error (skip-and-count).
    Result<std::optional<CsvRecord>> next();

    // Passes over the next record without parsing it (its line is read, not split or converted):
    // true if there was one, false at the end. A bad line passed over is not noticed, so a reader
    // that drops bad records (skip-and-count) must parse instead, or the record positions differ.
    Result<bool> skip();

    const std::string& path() const { return m_path; }
    const std::vector<std::string>& featureNames() const { return m_featureNames; }
    int64_t featureCount() const { return static_cast<int64_t>(m_featureCols.size()); }

    // Data lines (non-blank lines after the header) of a CSV file: a fast newline count.
    static Result<int64_t> countRecords(const std::string& path);

private:
    CsvReader() = default;
    // The next line, without its line end, as a view into the read buffer (valid until the next
    // read: no copy per line).
    bool readLine(std::string_view& line);
    // The next non-blank line; false at the end.
    Result<bool> nextLine(std::string_view& line);

    std::string m_path;
    CsvOptions m_options;
    std::FILE* m_file = nullptr;
    char* m_buf = nullptr;
    std::size_t m_bufCap = 0;
    int64_t m_line = 0;                 // lines read so far
    std::size_t m_columns = 0;          // fields per row (the header's)
    std::vector<std::string> m_header;
    std::vector<int> m_featureCols;     // column index of each feature
    std::vector<std::string> m_featureNames;
    int m_labelCol = -1;
    std::vector<int> m_role;            // per column: -1 ignored, -2 label, else feature slot
};

} // namespace ts
