package weights

import (
	"reflect"
	"testing"
)

func TestCompute_CPUShareFollowsThePublishedShareRule(t *testing.T) {
	cases := map[string]struct {
		endpoints []Endpoint
		want      []int
	}{
		"each weight moves 15% of the way to its share of the sum by weight / CPU": {
			// mean CPU 2: scores 2000 and 666.7 of 2666.7; shares of Σw = 2000 are 1500 and 500.
			endpoints: []Endpoint{ep("a", 1, 100, 0, 1000), ep("b", 3, 100, 0, 1000)},
			want:      []int{1075, 925}, // 1000 + 0.15×500, 1000 − 0.15×500
		},
		"an increase is capped at a quarter of the mean weight, a decrease is not": {
			// mean CPU 2.75, Σw 2000, mean weight 666.7: a's share 1684.2 would raise it by 177.6,
			// capped at 166.7; b and c fall to shares 105.3 and 210.5 by 15% of the way.
			endpoints: []Endpoint{ep("a", 0.25, 100, 0, 500), ep("b", 4, 100, 0, 500), ep("c", 4, 100, 0, 1000)},
			want:      []int{667, 441, 882},
		},
		"weights are not clamped to 100..600, and a sum below 100 per endpoint multiplies all by 10": {
			// mean CPU 1.5: scores 30 and 54 of 84; shares of Σw = 100 are 35.7 and 64.3 →
			// 10 + 3.86, 90 − 3.86; the sum stays 100 < 2×100, so every weight is multiplied by 10.
			endpoints: []Endpoint{ep("a", 0.5, 100, 0, 10), ep("b", 2.5, 100, 0, 90)},
			want:      []int{139, 861},
		},
		"every weight goes to 600 when the mean CPU is below 0.2 cores": {
			endpoints: []Endpoint{ep("a", 0.1, 100, 0, 1500), ep("b", 0.2, 100, 0, 500)},
			want:      []int{600, 600},
		},
		"every weight is multiplied by 10 when the weights sum to less than 100 per endpoint": {
			endpoints: []Endpoint{ep("a", 1, 100, 0, 20), ep("b", 1, 100, 0, 20)},
			want:      []int{200, 200},
		},
		"a new endpoint gets the mean of the lowest 10% of the weights": {
			// 11 weighted endpoints: the lowest 10% is one weight, 100.
			endpoints: []Endpoint{
				ep("a", 1, 100, 0, 100), ep("b", 1, 100, 0, 900), ep("c", 1, 100, 0, 900), ep("d", 1, 100, 0, 900),
				ep("e", 1, 100, 0, 900), ep("f", 1, 100, 0, 900), ep("g", 1, 100, 0, 900), ep("h", 1, 100, 0, 900),
				ep("i", 1, 100, 0, 900), ep("j", 1, 100, 0, 900), ep("k", 1, 100, 0, 900), ep("new", 1, 100, 0, 0),
			},
			want: []int{100, 900, 900, 900, 900, 900, 900, 900, 900, 900, 900, 100},
		},
		"an endpoint without metrics keeps its weight and takes no part in the shares": {
			endpoints: []Endpoint{ep("a", 1, 100, 0, 1000), ep("b", 3, 100, 0, 1000), ep("c", 0, 0, 0, 400, noMetrics)},
			want:      []int{1075, 925, 400},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d, err := Compute(Input{Endpoints: tc.endpoints}, DefaultSettings(AlgorithmCPUShare))
			if err != nil {
				t.Fatal(err)
			}
			if got := weightsOf(d); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("weights %v, want %v (%+v)", got, tc.want, d.Endpoints)
			}
		})
	}
}

func TestCPUShareNewWeight_MeanOfTheLowestTenthOrTheDefault(t *testing.T) {
	s := DefaultSettings(AlgorithmCPUShare)
	if got := CPUShareNewWeight(nil, s); got != 1000 {
		t.Errorf("no weights: %d, want the default 1000", got)
	}
	if got := CPUShareNewWeight([]int{700, 300}, s); got != 300 {
		t.Errorf("two weights: %d, want the lowest, 300", got)
	}
	twenty := []int{50, 10, 900, 900, 900, 900, 900, 900, 900, 900, 900, 900, 900, 900, 900, 900, 900, 900, 900, 900}
	if got := CPUShareNewWeight(twenty, s); got != 30 {
		t.Errorf("twenty weights: %d, want the mean of the lowest two, 30", got)
	}
}

func TestCompute_CPUDistanceFirstCycleFromThePublishedStartClampsEveryPodTo350(t *testing.T) {
	// The published operator writes 1000 for every endpoint first. Its first cycle clamps every
	// weight to 600, inside the dead band too, and the rescale brings all to 350.
	endpoints := []Endpoint{ep("a", 1, 100, 0, 1000), ep("b", 2, 100, 0, 1000), ep("c", 2.02, 100, 0, 1000), ep("d", 3, 100, 0, 1000)}
	d, err := Compute(Input{Endpoints: endpoints}, cpuDistance(0.01))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := weightsOf(d), []int{350, 350, 350, 350}; !reflect.DeepEqual(got, want) {
		t.Fatalf("weights %v, want %v (%+v)", got, want, d.Endpoints)
	}
}
