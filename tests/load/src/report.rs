//! Percentiles, throughput and calls in flight over time, and the PNG plot of a run.
use std::path::Path;

use anyhow::Context as _;
use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde::Serialize;

/// Latency percentiles, milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// Percentiles of values given in microseconds.
pub fn percentiles(values_us: &[u64]) -> Percentiles {
    let mut h = Histogram::<u64>::new(3).expect("histogram");
    for v in values_us {
        h.record(*v).expect("auto-resizing histogram");
    }
    if h.is_empty() {
        return Percentiles::default();
    }
    let ms = |v: u64| v as f64 / 1000.0;
    Percentiles {
        count: h.len(),
        mean_ms: h.mean() / 1000.0,
        p50_ms: ms(h.value_at_quantile(0.50)),
        p95_ms: ms(h.value_at_quantile(0.95)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        p999_ms: ms(h.value_at_quantile(0.999)),
        max_ms: ms(h.max()),
    }
}

/// Events per second, one point a second, between `from_us` and `to_us` (x: seconds from
/// `from_us`).
pub fn per_second(times_us: &[u64], from_us: u64, to_us: u64) -> Vec<(f64, f64)> {
    let n = ((to_us.saturating_sub(from_us)) / 1_000_000) as usize + 1;
    let mut buckets = vec![0u64; n];
    for t in times_us {
        if *t >= from_us && *t < to_us {
            buckets[((t - from_us) / 1_000_000) as usize] += 1;
        }
    }
    buckets
        .into_iter()
        .enumerate()
        .map(|(i, c)| (i as f64, c as f64))
        .collect()
}

/// How many intervals `[start, end)` (µs) overlap, between `from_us` and `to_us`: the mean
/// over that span and the most at any moment. An interval without an end lasts to `to_us`.
pub fn concurrency(intervals: &[(u64, Option<u64>)], from_us: u64, to_us: u64) -> (f64, u64) {
    if to_us <= from_us {
        return (0.0, 0);
    }
    let mut events: Vec<(u64, i64)> = Vec::new();
    let mut busy_us: u128 = 0;
    for (start, end) in intervals {
        let end = end.unwrap_or(to_us);
        let (s, e) = ((*start).max(from_us), end.min(to_us));
        if s < e {
            busy_us += (e - s) as u128;
        }
        // Intervals begun before `from_us` count from `from_us`.
        if *start < to_us && end > from_us {
            events.push((s, 1));
            events.push((e.max(s), -1));
        }
    }
    // At equal times, ends before starts: back-to-back calls are not at once.
    events.sort_unstable();
    let (mut now, mut most) = (0i64, 0i64);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    (
        busy_us as f64 / (to_us - from_us) as f64,
        most.max(0) as u64,
    )
}

/// One scenario's curves.
pub struct PlotSeries {
    pub name: String,
    /// (seconds, turns completed in that second)
    pub throughput: Vec<(f64, f64)>,
    /// Pipeline overhead samples of the answered messages, µs (empty: not plotted).
    pub overhead_us: Vec<u64>,
    /// Messages never answered: they count in the fractions, so the curve ends below 1.
    pub unanswered: u64,
}

/// One memory stage's lag in one scenario: (seconds since the scenario started, age of the
/// oldest unprocessed message in seconds).
pub struct PlotLagLine {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // plotters' ab_glyph backend draws text with fonts registered here; no system fonts.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

/// Throughput over time (top), the distribution of the pipeline overhead (as a cumulative
/// curve) of each scenario and, when there are any, the memory workers' lag over time
/// (bottom), in one PNG.
pub fn plot(
    path: &Path,
    title: &str,
    series: &[PlotSeries],
    lag: &[PlotLagLine],
) -> anyhow::Result<()> {
    register_font();
    let height = if lag.is_empty() { 1000 } else { 1480 };
    let root = BitMapBackend::new(path, (1400, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 26))?;
    let (top, rest) = root.split_vertically(480);
    let (bottom, lag_area) = rest.split_vertically(if lag.is_empty() { 520 } else { 500 });
    if !lag.is_empty() {
        plot_lag(&lag_area, lag)?;
    }

    let max_t = series
        .iter()
        .flat_map(|s| s.throughput.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let max_y = series
        .iter()
        .flat_map(|s| s.throughput.iter().map(|p| p.1))
        .fold(1.0f64, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&top)
        .caption("Turns completed per second", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_t, 0.0..max_y)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the scenario started")
        .y_desc("turns/s")
        .label_style(("sans-serif", 15))
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                s.throughput.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;

    let with_latency: Vec<&PlotSeries> = series
        .iter()
        .filter(|s| !s.overhead_us.is_empty())
        .collect();
    let max_ms = with_latency
        .iter()
        .map(|s| percentiles(&s.overhead_us).p999_ms)
        .fold(1.0f64, f64::max)
        * 1.05;
    let mut chart = ChartBuilder::on(&bottom)
        .caption(
            "Pipeline overhead (gateway accepted -> Twilio received, minus runner time): share of messages at or below (unanswered: never)",
            ("sans-serif", 18),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_ms, 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("milliseconds (up to p99.9)")
        .y_desc("fraction of messages")
        .label_style(("sans-serif", 15))
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        if s.overhead_us.is_empty() {
            continue;
        }
        let mut v = s.overhead_us.clone();
        v.sort_unstable();
        let n = (v.len() as u64 + s.unanswered) as f64;
        let step = (v.len() / 2000).max(1);
        let pts: Vec<(f64, f64)> = v
            .iter()
            .enumerate()
            .step_by(step)
            .map(|(k, us)| (*us as f64 / 1000.0, (k + 1) as f64 / n))
            .filter(|(ms, _)| *ms <= max_ms)
            .collect();
        let color = Palette99::pick(i).to_rgba();
        let label = if s.unanswered > 0 {
            format!("{} ({} never answered)", s.name, s.unanswered)
        } else {
            s.name.clone()
        };
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().context("writing the PNG")?;
    Ok(())
}

/// The memory workers' lag: one line per stage and scenario.
fn plot_lag<DB>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    lag: &[PlotLagLine],
) -> anyhow::Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
{
    let max_t = lag
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let max_y = lag
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(1.0f64, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Memory workers' lag: age of the oldest unprocessed message (summary: overdue past the idle gap)",
            ("sans-serif", 18),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_t, 0.0..max_y)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the scenario started")
        .y_desc("lag, s")
        .label_style(("sans-serif", 15))
        .draw()?;
    for (i, l) in lag.iter().enumerate() {
        // Colours after the scenarios', so a stage's line is not read as a scenario's.
        let color = Palette99::pick(i + 4).to_rgba();
        chart
            .draw_series(LineSeries::new(
                l.points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(l.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    Ok(())
}

/// The series legend, boxed, in one corner of the chart.
fn draw_legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .position(position)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_counts_overlapping_calls_in_the_span() {
        // Two calls over the whole span, one over half of it, one before it, one still running.
        let calls = [
            (0, Some(2_000)),
            (500, Some(1_500)),
            (1_000, Some(1_500)),
            (0, Some(900)),
            (1_800, None),
        ];
        let (mean, most) = concurrency(&calls, 1_000, 2_000);
        assert_eq!(most, 3);
        // 1000 + 500 + 500 + 0 + 200 µs busy over 1000 µs.
        assert!((mean - 2.2).abs() < 1e-9, "{mean}");
        // Back to back is not at once.
        assert_eq!(concurrency(&[(0, Some(10)), (10, Some(20))], 0, 20).1, 1);
    }
}
