package main

import (
	"fmt"
	"math"
	"strings"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// reactionTable is the bench's table of the default's reactions to slowdowns: for every event of
// the suite that slows a pod group down, how long the controller took to write a lower weight for
// one of its pods under each seed, the median over all of them, and the scenario's p99 against the
// in-band balancers that react within requests. Empty when no scenario slows a pod down.
func reactionTable(rows []benchRow, policies []string) string {
	var b strings.Builder
	var all []float64
	never := 0
	for _, r := range rows {
		if len(r.seedReactions) == 0 || len(r.seedReactions[0]) == 0 {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("\nTime from a pod's slowdown to the first weight write that lowers its weight (`tail`, seconds, the write not its arrival at the clients; \"never\" when none came before the end), per slowdown and seed, and `tail`'s p99 over the better of `peak-ewma` and `orca-wrr` under the scenario's seed:\n\n")
			b.WriteString("| scenario | slowdown at | first cut after (s), per seed | tail p99 / in-band best |\n| --- | --- | --- | --- |\n")
		}
		inBand := "–"
		if has(policies, sim.PolicyPeakEWMA) && has(policies, sim.PolicyORCAWRR) && has(policies, sim.PolicyTail) {
			best := math.Min(r.results[sim.PolicyPeakEWMA].Latency.P99, r.results[sim.PolicyORCAWRR].Latency.P99)
			inBand = fmt.Sprintf("%.2f (%.1f / %.1f ms)", r.results[sim.PolicyTail].Latency.P99/best, r.results[sim.PolicyTail].Latency.P99, best)
		}
		for e := range r.seedReactions[0] {
			var cells []string
			for k := range r.seedReactions {
				if e >= len(r.seedReactions[k]) {
					continue
				}
				x := r.seedReactions[k][e]
				if x.CutAfterS < 0 {
					cells = append(cells, "never")
					never++
					all = append(all, math.Inf(1)) // counts as the slowest
					continue
				}
				cells = append(cells, fmt.Sprintf("%.0f", x.CutAfterS))
				all = append(all, x.CutAfterS)
			}
			ev := r.seedReactions[0][e]
			fmt.Fprintf(&b, "| %s | %.0f s (%s) | %s | %s |\n", r.scenario, ev.AtS, ev.Group, strings.Join(cells, ", "), inBand)
			inBand = ""
		}
	}
	if b.Len() == 0 {
		return ""
	}
	fmt.Fprintf(&b, "\nMedian over the %d slowdowns and seeds (one without a cut counts as the slowest): ", len(all))
	if m := median(all); math.IsInf(m, 1) {
		b.WriteString("never")
	} else {
		fmt.Fprintf(&b, "%.0f s", m)
	}
	if never > 0 {
		fmt.Fprintf(&b, "; %d got no cut", never)
	}
	b.WriteString(".\n")
	return b.String()
}
