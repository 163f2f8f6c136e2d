package sim

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// WritePlot draws, for every policy, the latency over time (p50 and p99 per 10 s) beside the
// weights over time, and saves the figure as PNG or SVG according to the file's extension.
func WritePlot(path, scenario string, results []*Result) error {
	ext := strings.ToLower(filepath.Ext(path))
	if ext != ".png" && ext != ".svg" {
		return fmt.Errorf("plot file %q must end in .png or .svg", path)
	}
	if len(results) == 0 {
		return fmt.Errorf("nothing to plot")
	}
	rows := len(results)
	width, height := 12*vg.Inch, vg.Length(rows)*3*vg.Inch
	var c interface {
		vg.CanvasSizer
		vg.CanvasWriterTo
	}
	if ext == ".svg" {
		c = vgsvg.New(width, height)
	} else {
		c = vgimg.PngCanvas{Canvas: vgimg.New(width, height)}
	}
	plots, canvases, err := layoutPlots(scenario, results, draw.New(c))
	if err != nil {
		return err
	}
	for i := range plots {
		for j := range plots[i] {
			plots[i][j].Draw(canvases[i][j])
		}
	}
	return writeCanvas(path, c)
}

// layoutPlots builds one row per result, latency beside weights, and places them on dc.
func layoutPlots(scenario string, results []*Result, dc draw.Canvas) ([][]*plot.Plot, [][]draw.Canvas, error) {
	rows := len(results)
	plots := make([][]*plot.Plot, rows)
	tops := make([]float64, rows)
	maxLat := 0.0
	for _, r := range results {
		for _, pt := range r.Timeline {
			if pt.P99 > maxLat {
				maxLat = pt.P99
			}
		}
	}
	end := 0.0
	for _, r := range results {
		if n := len(r.Timeline); n > 0 {
			end = math.Max(end, r.Timeline[n-1].TimeS)
		}
	}
	for i, r := range results {
		lat, err := latencyPlot(scenario, r, maxLat)
		if err != nil {
			return nil, nil, err
		}
		lat.X.Min, lat.X.Max = 0, end
		w, top, err := weightPlot(r, end)
		if err != nil {
			return nil, nil, err
		}
		plots[i], tops[i] = []*plot.Plot{lat, w}, top
	}
	tiles := draw.Tiles{Rows: rows, Cols: 2, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		keepClearOfLegend(plots[i][0], canvases[i][0], maxLat)
		keepClearOfLegend(plots[i][1], canvases[i][1], tops[i])
	}
	return plots, canvases, nil
}

// keepClearOfLegend raises the y axis of a plot whose legend sits in its top corner so that the
// highest line, at top, runs below the legend instead of under it. Only the y range changes, so
// the layout's heights stay as aligned.
func keepClearOfLegend(p *plot.Plot, c draw.Canvas, top float64) {
	if top <= 0 {
		return
	}
	// The legend hangs from the top of the area below the title; a millimetre more keeps the
	// line off the text.
	legendBottom := c.Max.Y - p.Legend.Rectangle(c).Size().Y - p.Legend.TextStyle.FontExtents().Descent
	if p.Title.Text != "" {
		legendBottom -= p.Title.TextStyle.Rectangle(p.Title.Text).Size().Y + p.Title.Padding
	}
	p.Y.Min = 0
	// The data area's padding follows the tick labels, which follow the range: a few rounds
	// reach the fixed point.
	for range 4 {
		data := p.DataCanvas(c)
		height := data.Max.Y - data.Min.Y
		free := max(legendBottom-vg.Millimeter-data.Min.Y, height/4)
		p.Y.Max = top * float64(height) / float64(free)
	}
}

func latencyPlot(scenario string, r *Result, maxLat float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: %s latency per 10 s", scenario, r.Policy)
	p.X.Label.Text = "simulated time (s)"
	p.Y.Label.Text = "latency (ms)"
	p.Y.Min, p.Y.Max = 0, maxLat*1.05
	p50 := make(plotter.XYs, len(r.Timeline))
	p99 := make(plotter.XYs, len(r.Timeline))
	for i, pt := range r.Timeline {
		p50[i] = plotter.XY{X: pt.TimeS, Y: pt.P50}
		p99[i] = plotter.XY{X: pt.TimeS, Y: pt.P99}
	}
	for _, s := range []struct {
		name string
		xys  plotter.XYs
		c    color.RGBA
	}{{"p50", p50, color.RGBA{R: 40, G: 110, B: 200, A: 255}}, {"p99", p99, color.RGBA{R: 210, G: 60, B: 40, A: 255}}} {
		if len(s.xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(s.xys)
		if err != nil {
			return nil, fmt.Errorf("latency line %s: %w", s.name, err)
		}
		l.Color = s.c
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p, nil
}

// weightPlot draws the mean weight of each pod group over time; top is the highest weight drawn.
func weightPlot(r *Result, end float64) (p *plot.Plot, top float64, err error) {
	p = plot.New()
	p.X.Min, p.X.Max = 0, end
	p.Title.Text = fmt.Sprintf("%s: weights per pod group (mean)", r.Policy)
	p.X.Label.Text = "simulated time (s)"
	p.Y.Label.Text = "weight"
	if len(r.Weights) == 0 {
		p.Title.Text = fmt.Sprintf("%s: no weights written (Envoy's own balancing)", r.Policy)
		return p, 0, nil
	}
	// Pods of one group get the same weight up to noise: plot one line per group.
	groups := map[string]plotter.XYs{}
	for _, wp := range r.Weights {
		sum, n := map[string]float64{}, map[string]int{}
		for pod, w := range wp.Weights {
			g := pod[:strings.LastIndex(pod, "-")]
			sum[g] += float64(w)
			n[g]++
		}
		for g := range sum {
			mean := sum[g] / float64(n[g])
			groups[g] = append(groups[g], plotter.XY{X: wp.TimeS, Y: mean})
			top = math.Max(top, mean)
		}
	}
	names := make([]string, 0, len(groups))
	for g := range groups {
		names = append(names, g)
	}
	sort.Strings(names)
	for i, g := range names {
		// Hold the last weight to the end of the run.
		if pts := groups[g]; len(pts) > 0 && pts[len(pts)-1].X < end {
			groups[g] = append(pts, plotter.XY{X: end, Y: pts[len(pts)-1].Y})
		}
		l, err := plotter.NewLine(groups[g])
		if err != nil {
			return nil, 0, fmt.Errorf("weight line %s: %w", g, err)
		}
		l.StepStyle = plotter.PostStep
		l.Color = plotColor(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(g, l)
	}
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p, top, nil
}

func plotColor(i int) color.RGBA {
	palette := []color.RGBA{
		{R: 31, G: 119, B: 180, A: 255}, {R: 255, G: 127, B: 14, A: 255}, {R: 44, G: 160, B: 44, A: 255},
		{R: 214, G: 39, B: 40, A: 255}, {R: 148, G: 103, B: 189, A: 255}, {R: 140, G: 86, B: 75, A: 255},
	}
	return palette[i%len(palette)]
}
