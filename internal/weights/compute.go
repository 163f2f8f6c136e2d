package weights

import "fmt"

// Compute decides the next weights for one Service's endpoints.
// SCAFFOLD: equal weights until the algorithms land (same session).
func Compute(endpoints []Endpoint, s Settings) (Decision, error) {
	if err := s.Validate(); err != nil {
		return Decision{}, fmt.Errorf("invalid weight settings: %w", err)
	}
	d := Decision{Endpoints: make([]Result, len(endpoints))}
	for i, ep := range endpoints {
		w := s.defaultWeight()
		if ep.CurrentWeight != w {
			d.Changed = true
		}
		d.Endpoints[i] = Result{ID: ep.ID, Weight: w, Reason: "equal weights"}
	}
	return d, nil
}
