package sim

import (
	"fmt"
	"testing"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

func TestLayoutPlots_LinesRunBelowTheLegend(t *testing.T) {
	// Four groups, the heaviest flat at the top of the range for the whole run, and a flat p99:
	// before the fix the highest line ran along the top of its panel, under the legend.
	var weights []WeightPoint
	var timeline []TimelinePoint
	for s := 0.0; s <= 600; s += 30 {
		weights = append(weights, WeightPoint{TimeS: s, Weights: map[string]int{"fast-0": 1000, "mid-0": 700, "slow-0": 300, "old-0": 100}})
		timeline = append(timeline, TimelinePoint{TimeS: s, P50: 10, P99: 40})
	}
	for _, rows := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d rows", rows), func(t *testing.T) {
			var results []*Result
			for i := range rows {
				results = append(results, &Result{Policy: fmt.Sprintf("p%d", i), Weights: weights, Timeline: timeline})
			}
			dc := draw.New(vgimg.New(12*vg.Inch, vg.Length(rows)*3*vg.Inch))
			plots, canvases, err := layoutPlots("test", results, dc)
			if err != nil {
				t.Fatal(err)
			}
			for i := range plots {
				for j, top := range []float64{40, 1000} { // the highest p99, the highest weight
					p, c := plots[i][j], canvases[i][j]
					data := p.DataCanvas(c)
					_, y := p.Transforms(&data)
					legendBottom := c.Max.Y - p.Legend.Rectangle(c).Size().Y - p.Legend.TextStyle.FontExtents().Descent -
						p.Title.TextStyle.Rectangle(p.Title.Text).Size().Y - p.Title.Padding
					if at := y(top); at > legendBottom {
						t.Errorf("row %d panel %d: %v is drawn at %.1f pt, above the legend's bottom at %.1f pt", i, j, top, at.Points(), legendBottom.Points())
					}
					if p.Y.Max > 3*top {
						t.Errorf("row %d panel %d: y axis up to %.0f for values up to %v: more room than the legend needs", i, j, p.Y.Max, top)
					}
				}
			}
		})
	}
}
