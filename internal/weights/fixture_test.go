package weights

// ep builds an endpoint with fresh metrics; options adjust it.
func ep(id string, cpu, rps, limit float64, weight int, opts ...func(*Endpoint)) Endpoint {
	e := Endpoint{ID: id, CPUCores: cpu, RequestRate: rps, CPULimitCores: limit, HasMetrics: true, CurrentWeight: weight}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func noMetrics(e *Endpoint) { e.HasMetrics = false }

func weightsOf(d Decision) []int {
	out := make([]int, len(d.Endpoints))
	for i, r := range d.Endpoints {
		out[i] = r.Weight
	}
	return out
}
