package simcli

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/adaptive-lb/adaptive-lb/internal/sim"
)

// RunOptions say what RunPolicies reports while it runs, and what it records.
type RunOptions struct {
	// Stderr receives the progress; nil shows none.
	Stderr io.Writer
	// Percent redraws a live percentage of the simulated time done, for a terminal.
	Percent bool
	// PolicyLines prints a line per policy as it finishes, with its p99 and how long it took: a
	// run of the default policies takes tens of seconds, and a log or a pipe shows no percentage.
	PolicyLines bool
	// Recorder, when set, records the first policy's run.
	Recorder *sim.MetricsRecorder
}

// RunPolicies simulates each policy on its own goroutine; runs are independent and deterministic,
// so the results come back in the order of policies whatever order they finish in.
func RunPolicies(sc *sim.Scenario, policies []string, opts RunOptions) ([]*sim.Result, error) {
	results := make([]*sim.Result, len(policies))
	errs := make([]error, len(policies))
	p := newProgress(sc.Name, len(policies), opts)
	var wg sync.WaitGroup
	for i, policy := range policies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runOpts := sim.Options{}
			if i == 0 {
				runOpts.Metrics = opts.Recorder
			}
			if opts.Percent && opts.Stderr != nil {
				runOpts.Progress = func(f float64) { p.advance(i, f) }
			}
			results[i], errs[i] = sim.Run(sc, policy, runOpts)
			p.finish(policy, results[i], errs[i])
		}()
	}
	wg.Wait()
	p.clear()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("simulation failed: %w", err)
	}
	return results, nil
}

// progress writes RunPolicies' progress: a percentage redrawn in place, and a line per policy
// that finishes. The percentage is erased before a line is written and redrawn at its next
// change, so the two never share a line.
type progress struct {
	scenario string
	opts     RunOptions
	start    time.Time

	mu        sync.Mutex
	done      []float64 // fraction of simulated time done, per policy
	finished  int
	lastShown int // the percentage on screen; -1 when none is
}

func newProgress(scenario string, policies int, opts RunOptions) *progress {
	return &progress{scenario: scenario, opts: opts, start: time.Now(), done: make([]float64, policies), lastShown: -1}
}

func (p *progress) advance(i int, f float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done[i] = f
	total := 0.0
	for _, d := range p.done {
		total += d
	}
	if pct := int(100 * total / float64(len(p.done))); pct != p.lastShown {
		p.lastShown = pct
		fmt.Fprintf(p.opts.Stderr, "\rsimulating %s: %3d%%", p.scenario, pct)
	}
}

// finish reports a policy's end: "tail done in 4.1 s, p99 23.6 ms (3 of 5)".
func (p *progress) finish(policy string, r *sim.Result, err error) {
	if !p.opts.PolicyLines || p.opts.Stderr == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.finished++
	p.eraseLocked()
	took := time.Since(p.start).Seconds()
	if err != nil {
		fmt.Fprintf(p.opts.Stderr, "%s failed after %.1f s (%d of %d): %v\n", policy, took, p.finished, len(p.done), err)
		return
	}
	fmt.Fprintf(p.opts.Stderr, "%s done in %.1f s, p99 %.1f ms (%d of %d)\n", policy, took, r.Latency.P99, p.finished, len(p.done))
}

// clear erases the percentage, so that what follows starts on a clean line.
func (p *progress) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.eraseLocked()
}

func (p *progress) eraseLocked() {
	if p.lastShown >= 0 {
		fmt.Fprint(p.opts.Stderr, "\r\033[K")
		p.lastShown = -1
	}
}
