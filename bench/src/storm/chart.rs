//! `storm.svg`: one panel per strategy, stacked on a shared time axis, each
//! on its own vertical scale, so a naive strategy's flood does not flatten
//! everyone else's line. Each panel draws, per second, the upstream's
//! capacity in force, the load offered to it and the load it served; the
//! coordinated strategies add the wake rate their coordinator showed.
//! Per-second steps rather than 100 ms bins: the bins are in `storm.json`
//! for anyone who wants them, and the steps are what a reader can compare.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::StormError;
use super::results::{StormResults, StrategyResult};

const WIDTH: u32 = 1100;
const PANEL_HEIGHT: u32 = 210;
const TITLE_HEIGHT: u32 = 40;
/// The sampled series drawn, when a strategy has it.
const WAKE_RATE: &str = "wake_rate_per_s";

fn chart_err(e: &dyn std::fmt::Display) -> StormError {
    StormError::Chart(e.to_string())
}

/// The chart of `results`, as an SVG document.
pub(super) fn svg(results: &StormResults) -> Result<String, StormError> {
    let seconds = results
        .results
        .iter()
        .map(|r| r.offered_per_s.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let panels = results.results.len().max(1) as u32;
    let mut svg = String::new();
    {
        let size = (WIDTH, TITLE_HEIGHT + panels * PANEL_HEIGHT);
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| chart_err(&e))?;
        let a = &results.args;
        let title = format!(
            "Requests per second by strategy: W={} C={}/s λ={}/s, outage {}–{} s at {}×C, {}×C after",
            a.workers,
            a.capacity,
            results.arrival_rate,
            a.outage_start_s,
            a.outage_start_s + a.outage_s,
            a.outage_capacity,
            a.capacity_after
        );
        let body = root
            .titled(&title, ("sans-serif", 18))
            .map_err(|e| chart_err(&e))?;
        let areas = body.split_evenly((results.results.len().max(1), 1));
        for (result, area) in results.results.iter().zip(&areas) {
            panel(result, area, seconds as f64)?;
        }
        root.present().map_err(|e| chart_err(&e))?;
    }
    Ok(svg)
}

/// `values[i]` held over second `[i, i + 1)`, as a line of steps.
fn steps(values: impl IntoIterator<Item = f64>) -> Vec<(f64, f64)> {
    values
        .into_iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .flat_map(|(i, v)| [(i as f64, v), (i as f64 + 1.0, v)])
        .collect()
}

fn panel(
    r: &StrategyResult,
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    x_max: f64,
) -> Result<(), StormError> {
    let offered = steps(r.offered_per_s.iter().map(|&n| f64::from(n)));
    let served = steps(r.served_per_s.iter().map(|&n| f64::from(n)));
    let capacity = steps(r.capacity_per_s.iter().copied());
    let wake = r
        .coordinator
        .as_ref()
        .and_then(|c| c.scope_per_s.get(WAKE_RATE))
        .map(|w| steps(w.iter().map(|v| v.unwrap_or(f64::NAN))));
    let y_max = offered
        .iter()
        .chain(&capacity)
        .chain(wake.iter().flatten())
        .map(|&(_, y)| y)
        .fold(1.0, f64::max)
        * 1.08;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "({}) {}: goodput {:.1}%, amplification {:.2}, peak/capacity {:.2}",
                r.strategy.key(),
                r.strategy.label(),
                r.goodput * 100.0,
                r.amplification,
                r.peak_over_capacity_in_force
            ),
            ("sans-serif", 14),
        )
        .margin(6)
        .x_label_area_size(24)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| chart_err(&e))?;
    chart
        .configure_mesh()
        .x_desc("s")
        .y_desc("per second")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .max_light_lines(2)
        .draw()
        .map_err(|e| chart_err(&e))?;
    let mut lines = vec![
        ("offered", offered, RGBColor(214, 39, 40).stroke_width(1)),
        ("served", served, RGBColor(44, 160, 44).stroke_width(2)),
        ("capacity in force", capacity, BLACK.stroke_width(2)),
    ];
    if let Some(wake) = wake {
        lines.push(("wake rate", wake, RGBColor(31, 119, 180).stroke_width(2)));
    }
    for (name, points, style) in lines {
        chart
            .draw_series(LineSeries::new(points, style))
            .map_err(|e| chart_err(&e))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| chart_err(&e))?;
    Ok(())
}
