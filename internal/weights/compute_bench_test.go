package weights

import (
	"fmt"
	"math/rand"
	"testing"
)

// BenchmarkCompute measures one Service's decision; the operator runs one per Service per cycle.
func BenchmarkCompute(b *testing.B) {
	for _, alg := range Algorithms {
		for _, n := range []int{20, 200} {
			b.Run(fmt.Sprintf("%s/endpoints=%d", alg, n), func(b *testing.B) {
				r := rand.New(rand.NewSource(1))
				eps := make([]Endpoint, n)
				for i := range eps {
					eps[i] = ep(fmt.Sprintf("pod-%d", i), 0.1+r.Float64(), 50+r.Float64()*100, 2, 80+r.Intn(40))
				}
				s := DefaultSettings(alg)
				b.ReportAllocs()
				for b.Loop() {
					if _, err := Compute(Input{Endpoints: eps}, s); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkPodModelBuild measures building one pod shape's latency table (the tail algorithm
// builds one per group and size variability on first sight, then reads it from the cache).
func BenchmarkPodModelBuild(b *testing.B) {
	for i := 0; i < b.N; i++ {
		buildModel(newModelKey(8, 2, 0.0029, 1))
	}
}
