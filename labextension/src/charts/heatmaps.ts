/**
 * A vector value's small multiples as an ECharts option, plain data (no DOM,
 * no ECharts import, unit-tested with Jest): one heatmap per run (steps
 * across, vector index down) on one shared colour scale, and optionally the
 * difference of two runs on a diverging scale of its own.
 *
 * One colour bar per scale, to the right of the whole grid (not under its
 * last heatmap, where it read as that run's own), from and to round numbers;
 * the step axis is labelled at round steps (0, 50, 100, not 0, 17, 34).
 */
import type { IVectorSeries } from './data';
import { absMax, diffVectors, seriesLabel, sharedRange, vectorAxisName } from './data';
import { escapeHTML, formatNumber, naturalCompare } from '../common/text';

/** Below this chart width the layout is compact (the sidebar's default is 250 px). */
export const COMPACT_WIDTH = 420;

export const VIRIDIS = ['#440154', '#3b528b', '#21918c', '#5ec962', '#fde725'];
export const DIVERGING = ['#2166ac', '#92c5de', '#f7f7f7', '#f4a582', '#b2182b'];

const HEAT_TOP = 24; // the value's title
const HEAT_BLOCK = 44; // a run's label above its grid and the step labels below
const HEAT_BOTTOM = 8;
/** room on the right for the colour bars */
export const BAR_ROOM = 64;

/** A round step for about `target` ticks over `span`: 1, 2 or 5 times a power of ten. */
export function niceStep(span: number, target = 5): number {
  if (!(span > 0) || !Number.isFinite(span)) {
    return 1;
  }
  const raw = span / Math.max(1, target);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) {
    if (m * mag >= raw * 0.999) {
      return m * mag;
    }
  }
  return 10 * mag;
}

/** [lo, hi] widened to multiples of a round step (a colour bar's ends). */
export function niceRange(lo: number, hi: number, target = 4): [number, number] {
  if (!(hi > lo)) {
    return [lo, hi];
  }
  const step = niceStep(hi - lo, target);
  const r = (v: number): number => Number(v.toPrecision(12));
  return [r(Math.floor(lo / step) * step), r(Math.ceil(hi / step) * step)];
}

/**
 * Which of a heatmap's steps get a label: about `target` at round steps
 * (multiples of niceStep), each the first step at or after its multiple.
 */
export function roundTickIndices(steps: number[], target = 5): Set<number> {
  const out = new Set<number>();
  if (!steps.length) {
    return out;
  }
  const lo = steps[0];
  const hi = steps[steps.length - 1];
  const step = niceStep(hi - lo, target);
  let i = 0;
  for (let m = Math.ceil(lo / step) * step; m <= hi; m += step) {
    while (i < steps.length && steps[i] < m) {
      i++;
    }
    if (i < steps.length && steps[i] - m < step / 2) {
      out.add(i);
    }
  }
  if (!out.size) {
    out.add(0);
  }
  return out;
}

/** How the small multiples of one vector value are laid out in a chart of `width` pixels. */
export function heatmapLayout(
  n: number,
  width: number
): { cols: number; rows: number; cellHeight: number; height: number } {
  const cols = Math.max(1, Math.min(n, Math.floor((width - BAR_ROOM) / 280)));
  const rows = Math.ceil(n / cols);
  const cellHeight = width < COMPACT_WIDTH ? 96 : 130;
  return { cols, rows, cellHeight, height: HEAT_TOP + rows * (cellHeight + HEAT_BLOCK) + HEAT_BOTTOM };
}

/** A colour bar's title: the value's name, cut to what fits in the bar's room. */
export function barTitle(name: string): string {
  return name.length > 11 ? `${name.slice(0, 10)}…` : name;
}

/** An echarts visualMap: the vertical colour bar of the heatmaps `seriesIndex`, from `min` to `max`, titled `title`. */
function colourBar(
  seriesIndex: number[],
  min: number,
  max: number,
  colours: string[],
  top: number,
  length: number,
  title: string
) {
  return {
    seriesIndex,
    // the bar's title above it: what its colours stand for (the value's name, or the difference)
    text: [title, ''],
    textGap: 6,
    min,
    max,
    calculable: true,
    orient: 'vertical',
    right: 8,
    top,
    itemWidth: 12,
    itemHeight: length,
    textStyle: { fontSize: 10 },
    formatter: (v: number) => formatNumber(Number(Number(v).toPrecision(3))),
    inRange: { color: colours }
  };
}

/**
 * Option for one vector value: one heatmap per run sharing one colour scale,
 * plus `diff` (a - b) on a diverging scale of its own when given.
 */
export function heatmapOption(
  name: string,
  bySeries: { [series: string]: IVectorSeries },
  width: number,
  diff: [string, string] | null = null
): { [key: string]: unknown } {
  const keys = Object.keys(bySeries).sort(naturalCompare);
  const panels: { title: string; data: IVectorSeries; isDiff: boolean }[] = keys.map(k => ({
    title: seriesLabel(k),
    data: bySeries[k],
    isDiff: false
  }));
  if (diff && bySeries[diff[0]] && bySeries[diff[1]]) {
    panels.push({
      title: `${seriesLabel(diff[0])} − ${seriesLabel(diff[1])}`,
      data: diffVectors(bySeries[diff[0]], bySeries[diff[1]]),
      isDiff: true
    });
  }
  const layout = heatmapLayout(panels.length, width);
  const [lo, hi] = niceRange(...sharedRange(bySeries));
  const axisName = vectorAxisName(name);
  const colWidth = (width - BAR_ROOM) / layout.cols;
  const left = 40;
  const titles: object[] = [{ text: name, left: 4, top: 2, textStyle: { fontSize: 12 } }];
  const grids: object[] = [];
  const xAxes: object[] = [];
  const yAxes: object[] = [];
  const series: object[] = [];
  const runIndices: number[] = [];
  const diffIndices: number[] = [];
  panels.forEach((p, i) => {
    const col = i % layout.cols;
    const row = Math.floor(i / layout.cols);
    const x = col * colWidth + left;
    const y = HEAT_TOP + row * (layout.cellHeight + HEAT_BLOCK) + 16;
    const gridWidth = Math.max(40, colWidth - left - 10);
    titles.push({ text: p.title, left: x, top: y - 16, textStyle: { fontSize: 11, fontWeight: 'normal' } });
    grids.push({ left: x, top: y, width: gridWidth, height: layout.cellHeight });
    const vecWidth = p.data.rows.reduce((m, r) => Math.max(m, r.length), 0);
    const ticks = roundTickIndices(p.data.steps, gridWidth < 200 ? 3 : 5);
    xAxes.push({
      type: 'category',
      gridIndex: i,
      data: p.data.steps.map(s => formatNumber(s)),
      axisLabel: { fontSize: 10, interval: (index: number) => ticks.has(index) },
      axisTick: { interval: (index: number) => ticks.has(index) }
    });
    yAxes.push({
      type: 'category',
      gridIndex: i,
      name: axisName,
      nameLocation: 'middle',
      nameGap: 24,
      nameTextStyle: { fontSize: 10 },
      data: Array.from({ length: vecWidth }, (_, j) => String(j)),
      axisLabel: { fontSize: 9, hideOverlap: true }
    });
    const cells: [number, number, number][] = [];
    p.data.rows.forEach((r, si) =>
      r.forEach((v, j) => {
        if (v !== null && Number.isFinite(v)) {
          cells.push([si, j, v]);
        }
      })
    );
    (p.isDiff ? diffIndices : runIndices).push(i);
    series.push({
      id: p.isDiff ? 'diff' : `run:${keys[i]}`,
      name: p.title,
      type: 'heatmap',
      xAxisIndex: i,
      yAxisIndex: i,
      data: cells,
      progressive: 10000
    });
  });
  // one bar per scale, right of the whole grid: the runs' shared one, then the difference's (centred on 0)
  const gridHeight = layout.height - HEAT_TOP - HEAT_BOTTOM - 40;
  const bars = diffIndices.length ? 2 : 1;
  const barLength = Math.max(50, Math.min(220, gridHeight / bars - 30));
  const visualMap: object[] = [colourBar(runIndices, lo, hi, VIRIDIS, HEAT_TOP + 30, barLength, barTitle(name))];
  if (diffIndices.length) {
    const m = niceRange(0, absMax((panels[panels.length - 1] as { data: IVectorSeries }).data))[1];
    visualMap.push(colourBar(diffIndices, -m, m, DIVERGING, HEAT_TOP + 30 + barLength + 54, barLength, 'difference'));
  }
  return {
    animation: false,
    backgroundColor: 'transparent',
    title: titles,
    tooltip: {
      confine: true,
      formatter: (p: unknown) => {
        const { seriesIndex, value } = p as { seriesIndex: number; value: [number, number, number] };
        const panel = panels[seriesIndex];
        const step = panel ? panel.data.steps[value[0]] : value[0];
        return `${escapeHTML(panel?.title ?? '')}<br/>step ${formatNumber(step)}, ${axisName} ${value[1]}: <b>${formatNumber(value[2])}</b>`;
      }
    },
    toolbox: {
      right: 4,
      top: 0,
      itemSize: 12,
      feature: { saveAsImage: { title: 'PNG', name: name.replace(/\W+/g, '_'), pixelRatio: 2 } }
    },
    grid: grids,
    xAxis: xAxes,
    yAxis: yAxes,
    visualMap,
    series
  };
}
