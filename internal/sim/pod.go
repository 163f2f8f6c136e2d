package sim

import "math"

// cfsPeriod is the CFS bandwidth period Kubernetes uses (cpu.cfs_period_us = 100000).
const cfsPeriod = 0.1

// pod models one server pod's CPU the way Linux runs it inside a Kubernetes CPU limit:
//   - up to `workers` requests are in service at once; more wait in a FIFO queue;
//   - requests in service share min(n, cores) CPUs equally (processor sharing), each using at
//     most one CPU;
//   - the CFS bandwidth controller grants cpu_limit × 100 ms of CPU time per 100 ms period; once
//     the pod has spent it, every request stalls until the period ends.
//
// Work is tracked with a virtual clock: every request in service has received the same CPU time
// since the pod's `vwork` started, so a request finishes when vwork reaches its finishV.
type pod struct {
	id      int32
	name    string
	group   int
	speed   float64
	cores   float64
	workers int
	quota   float64 // CPU-seconds per CFS period; 0 means no limit
	limit   float64 // cores

	running []inService
	// minFinish is the least finish among running, +Inf when none runs: the next completion.
	minFinish float64
	queue     []int32 // FIFO of request ids waiting for a worker
	qhead     int

	vwork     float64
	lastT     float64
	used      float64 // CPU-seconds spent in the current period
	periodEnd float64
	throttled bool
	wakeAt    float64 // the pending wake's time; -1 when none is pending or it may be stale

	inHostSet bool // receives new requests
	born      float64

	// Counters, cumulative since the start of the run.
	cpu          float64 // CPU-seconds used
	served       uint64  // completed requests
	throttledFor float64 // seconds spent throttled with requests waiting
	area         float64 // ∫ requests in the pod dt, for Little's law
	errors       uint64
	// rifLatency serves Prequal's probes: the latencies of recently completed requests, kept by
	// the requests-in-flight each found on arrival. A probe reports the median for the current
	// RIF, so an idle pod reports what a request arriving now would see, not its busy past.
	rifLatency []latencyRing
	// latencies counts completed requests by in-pod latency, as the destination sidecar's
	// istio_request_duration_milliseconds histogram would.
	latencies latencyHistogram
	// latencySumMS sums the in-pod latencies in milliseconds: the histogram's _sum series.
	latencySumMS float64
}

// inService is a request in service and the pod's vwork at which it completes.
type inService struct {
	finish float64
	id     int32
}

// start puts a request needing cost CPU-seconds on reference hardware in service.
func (p *pod) start(id int32, cost float64) {
	f := p.vwork + cost/p.speed
	p.running = append(p.running, inService{finish: f, id: id})
	p.minFinish = min(p.minFinish, f)
}

func (p *pod) inSystem() int { return len(p.running) + len(p.queue) - p.qhead }

// advance brings the pod's CPU accounting to time t. It is safe to call at any time; it does not
// change when the pod next needs to wake.
func (p *pod) advance(t float64) {
	dt := t - p.lastT
	if dt > 0 {
		n := len(p.running)
		p.area += float64(p.inSystem()) * dt
		if n > 0 {
			if p.throttled {
				p.throttledFor += dt
			} else if nf := float64(n); nf <= p.cores {
				// Every request has a CPU of its own: its share busy/n is exactly 1, so no
				// division is needed for the same result.
				p.vwork += dt
				p.used += nf * dt
				p.cpu += nf * dt
			} else {
				p.vwork += p.cores / nf * dt
				p.used += p.cores * dt
				p.cpu += p.cores * dt
			}
		}
		p.lastT = t
	}
	// A busy, unthrottled pod always has a wake at its period end, so only an idle or throttled
	// pod can get here past it; then no CPU was used in between and the reset is exact.
	if t >= p.periodEnd-1e-12 {
		p.periodEnd += (math.Floor((t-p.periodEnd)/cfsPeriod) + 1) * cfsPeriod
		p.used = 0
		p.throttled = false
	}
	if p.quota > 0 && p.used >= p.quota-1e-12 && len(p.running) > 0 {
		p.throttled = true
	}
}

// nextWake returns when the pod next changes state on its own, or +Inf when idle.
func (p *pod) nextWake() float64 {
	n := len(p.running)
	if n == 0 {
		return math.Inf(1)
	}
	if p.throttled {
		return p.periodEnd
	}
	minFinish := p.minFinish
	// Each request progresses at busy/n CPUs; with no more requests than cores that is exactly 1.
	nf := float64(n)
	busy := min(nf, p.cores)
	wake := p.lastT + max(0, minFinish-p.vwork)
	if nf > p.cores {
		wake = p.lastT + max(0, minFinish-p.vwork)/(busy/nf)
	}
	if p.quota > 0 {
		wake = min(wake, p.lastT+max(0, p.quota-p.used)/busy, p.periodEnd)
	}
	// lastT plus a small positive remainder rounds back to lastT once lastT is large (past 2048 s
	// a second has a resolution of 4.5e-13, while a remainder can be 1e-12 of quota over many
	// cores): the pod would wake at the same instant forever and never use the remainder up.
	// Unless a request completes at lastT, wake one step of the clock later instead.
	if wake <= p.lastT && minFinish > p.vwork+completionSlack {
		wake = math.Nextafter(p.lastT, math.Inf(1))
	}
	return wake
}

// completionSlack is how far short of its work a request may be and count as complete: the
// rounding of the pod's work clock.
const completionSlack = 1e-12

// setSpeed changes the hardware speed; work already in service keeps its progress.
func (p *pod) setSpeed(speed float64) {
	p.minFinish = math.Inf(1)
	for i := range p.running {
		r := &p.running[i]
		remaining := r.finish - p.vwork
		r.finish = p.vwork + remaining*p.speed/speed
		p.minFinish = min(p.minFinish, r.finish)
	}
	p.speed = speed
}

// prequalRIFBuckets caps the RIF levels a pod tracks latencies for; higher RIFs share the last.
const prequalRIFBuckets = 64

// latencyRing holds the last few latencies observed at one RIF level.
type latencyRing struct {
	samples [8]float64
	n, next int
}

func (r *latencyRing) add(v float64) {
	r.samples[r.next] = v
	r.next = (r.next + 1) % len(r.samples)
	r.n = min(r.n+1, len(r.samples))
}

func (r *latencyRing) median() float64 { return medianOf(r.samples[:r.n]) }

// recordRIFLatency files a completed request's in-pod latency under the RIF it found on arrival.
func (p *pod) recordRIFLatency(rif int, latency float64) {
	if p.rifLatency == nil {
		p.rifLatency = make([]latencyRing, prequalRIFBuckets)
	}
	p.rifLatency[min(rif, prequalRIFBuckets-1)].add(latency)
}

// estimateLatency is what a Prequal probe reports: the median recent latency at the current RIF,
// or at the nearest RIF level with samples (0 when the pod has completed nothing yet).
func (p *pod) estimateLatency() float64 {
	if p.rifLatency == nil {
		return 0
	}
	rif := min(p.inSystem(), prequalRIFBuckets-1)
	for d := 0; d < prequalRIFBuckets; d++ {
		for _, r := range []int{rif - d, rif + d} {
			if r >= 0 && r < prequalRIFBuckets && p.rifLatency[r].n > 0 {
				return p.rifLatency[r].median()
			}
		}
	}
	return 0
}
