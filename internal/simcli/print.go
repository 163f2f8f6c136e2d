package simcli

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// DescribeLag says how the controller reads its metrics, for a table's header.
func DescribeLag(m sim.Metrics) string {
	if m.Lagless() {
		return "metrics without lag"
	}
	s := fmt.Sprintf("metrics scraped every %v", m.ScrapeInterval.Duration)
	if q := m.QueryLatencyOffset.Duration; q == 0 {
		s += ", adaptive-lb reading the newest data"
	} else {
		s += fmt.Sprintf(", adaptive-lb reading %v in the past", q)
	}
	if m.IngestionDelay.Duration > 0 {
		s += fmt.Sprintf(" (ingested %v after each scrape)", m.IngestionDelay.Duration)
	}
	return s + fmt.Sprintf(", the published rules %v in the past", m.LatencyOffset.Duration)
}

// PrintResults prints the scenario's header, a row per policy and a table per pod.
func PrintResults(w io.Writer, sc *sim.Scenario, results []*sim.Result) error {
	pods, rps := 0, sc.Load.RPS
	for _, p := range sc.Pods {
		pods += p.Replicas
	}
	fmt.Fprintf(w, "Scenario %s: %d pods, %.0f rps, %v simulated (first %v excluded), seed %d, clients: %d proxies × %d workers on %s; %s\n\n",
		sc.Name, pods, rps, sc.Duration.Duration, sc.Warmup.Duration, sc.Seed, sc.Clients.Proxies, sc.Clients.Workers, sc.Clients.LB, DescribeLag(sc.Controller.Metrics))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tp50 ms\tp90 ms\tp95 ms\tp99 ms\tp99.9 ms\tmean ms\ttotal CPU\trequests\tweight writes\t")
	for _, r := range results {
		l := r.Latency
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%d\t%d\t\n", r.Policy, l.P50, l.P90, l.P95, l.P99, l.P999, l.Mean, r.TotalCPU, r.Requests, r.WeightWrites)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nPer pod: rps, CPU cores, p99 ms and final weight under each policy")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := "pod\t"
	for _, r := range results {
		header += r.Policy + " rps\tcpu\tp99\tweight\t"
	}
	fmt.Fprintln(tw, header)
	byName := make([]map[string]sim.PodResult, len(results))
	var names []string
	for i, r := range results {
		byName[i] = map[string]sim.PodResult{}
		for _, p := range r.Pods {
			byName[i][p.Name] = p
			if i == 0 {
				names = append(names, p.Name)
			}
		}
	}
	for _, n := range names {
		row := n + "\t"
		for i := range results {
			p, ok := byName[i][n]
			if !ok {
				row += "-\t-\t-\t-\t"
				continue
			}
			row += fmt.Sprintf("%.1f\t%.2f\t%.1f\t%d\t", p.RPS, p.CPU, p.Latency.P99, p.FinalWeight)
		}
		fmt.Fprintln(tw, row)
	}
	return tw.Flush()
}
