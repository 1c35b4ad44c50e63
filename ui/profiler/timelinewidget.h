#pragma once
// The profiler's timeline: one lane per worker / device / thread, nested spans in depth rows,
// coloured by category. Custom painted (not QCustomPlot) so that a frame costs one bisection per
// visible row plus at most one rectangle per pixel column: spans narrower than a pixel are merged
// into the column they fall in, which keeps a 1M-span trace well under 16 ms per frame.
//
// Mouse and keyboard: wheel zooms about the cursor (a horizontal wheel pans); drag pans in time
// and scrolls the lanes; click selects the span under the cursor; Shift+drag selects a time
// range. Keys: + / - zoom, Left / Right pan, Up / Down scroll, 0 or Home shows everything,
// Escape clears the selection.

#include <QElapsedTimer>
#include <QWidget>

#include <memory>
#include <vector>

#include "profiler/timelinedata.h"

namespace ts {

// The colour of a span category ("forward", "communication", "cpu_op", ...): the step parts have
// fixed colours, other categories a stable hue from their name.
QColor timelineCategoryColor(const std::string& category);
// "850 us", "12.5 ms", "3.20 s".
QString formatMicros(double us);

class TimelineWidget : public QWidget {
    Q_OBJECT
public:
    explicit TimelineWidget(QWidget* parent = nullptr);

    // Shows a trace (replaces the current one) and fits it to the view.
    void setData(std::shared_ptr<const TimelineData> data);
    void clear();
    const TimelineData* data() const { return m_data.get(); }

    // Visible time window, in the trace's microseconds.
    double visibleStartUs() const { return m_t0; }
    double visibleEndUs() const { return m_t1; }
    void setVisibleRange(double t0Us, double t1Us);
    void zoomBy(double factor, double anchorFraction = 0.5);  // factor > 1 zooms in
    void panByPixels(double dx);
    void zoomToFit();
    int scrollOffset() const { return m_scrollY; }

    int selectedSpan() const { return m_selected; }  // -1: none
    void selectSpan(int span);                        // emits spanSelected; -1 clears
    bool hasSelectedRange() const { return m_rangeValid; }
    int64_t rangeStartUs() const { return m_rangeT0; }
    int64_t rangeEndUs() const { return m_rangeT1; }
    void setSelectedRange(int64_t t0Us, int64_t t1Us);  // emits rangeSelected
    void clearSelectedRange();
    // Spans drawn with an accent outline (the spans behind an advisor finding).
    void setHighlightedSpans(std::vector<int> spans);
    const std::vector<int>& highlightedSpans() const { return m_highlighted; }

    // Geometry, in widget coordinates (also what tests click on).
    int spanAt(QPoint pos) const;
    QRectF spanRect(int span) const;  // empty when the span's row is scrolled out of view
    double xOfTime(double timeUs) const;
    double timeOfX(double x) const;

    // How long the last paintEvent took, in milliseconds.
    double lastFrameMs() const { return m_lastFrameMs; }

    QSize sizeHint() const override { return {900, 360}; }
    QSize minimumSizeHint() const override { return {200, 120}; }

Q_SIGNALS:
    void spanSelected(int span);
    void rangeSelected(qint64 t0Us, qint64 t1Us);
    void visibleRangeChanged(double t0Us, double t1Us);

protected:
    bool event(QEvent* event) override;
    void paintEvent(QPaintEvent* event) override;
    void wheelEvent(QWheelEvent* event) override;
    void mousePressEvent(QMouseEvent* event) override;
    void mouseMoveEvent(QMouseEvent* event) override;
    void mouseReleaseEvent(QMouseEvent* event) override;
    void mouseDoubleClickEvent(QMouseEvent* event) override;
    void keyPressEvent(QKeyEvent* event) override;
    void resizeEvent(QResizeEvent* event) override;
    void changeEvent(QEvent* event) override;

private:
    // Vertical layout: the ruler on top, then per lane a title band and its depth rows.
    int rowY(int row) const;      // content y of a row's top (before scrolling)
    int rowAtY(int y) const;      // widget y -> row, or -1
    int contentHeight() const;
    int plotLeft() const { return 0; }
    double plotWidth() const;
    void layoutRows();
    void clampView();
    void setScroll(int y);
    void paintRuler(class QPainter& p);
    void paintRow(class QPainter& p, int row, int y);

    std::shared_ptr<const TimelineData> m_data;
    std::vector<int> m_rowY;         // content y of each row
    std::vector<QColor> m_colors;    // by category id
    double m_t0 = 0, m_t1 = 1;
    int m_scrollY = 0;
    int m_selected = -1;
    bool m_rangeValid = false;
    int64_t m_rangeT0 = 0, m_rangeT1 = 0;
    std::vector<int> m_highlighted;  // sorted

    enum class Drag { None, Pending, Pan, Range };
    Drag m_drag = Drag::None;
    QPoint m_pressPos;
    double m_pressT0 = 0, m_pressT1 = 0;
    int m_pressScroll = 0;
    double m_lastFrameMs = 0;
};

} // namespace ts
