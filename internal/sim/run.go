package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"sort"
	"strings"

	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// Policies the simulator can run. The first three are Envoy's client balancers alone; the
// controller policies run adaptive-lb's weight engine on top of the scenario's client balancer.
const (
	PolicyRoundRobin   = LBRoundRobin
	PolicyRandom       = LBRandom
	PolicyLeastRequest = LBLeastRequest
	PolicyCPUDistance  = string(weights.AlgorithmCPUDistance)
	PolicyCapacity     = string(weights.AlgorithmCapacity)
	PolicyTail         = string(weights.AlgorithmTail)
	// PolicyCPUShare is the published operator's later share rule, a baseline beside
	// PolicyCPUDistance.
	PolicyCPUShare = string(weights.AlgorithmCPUShare)
	// PolicyOracle writes static weights proportional to every pod's true capacity, known from
	// the scenario, on the scenario's client balancer: what perfect knowledge of the hardware gives
	// a weight-based approach.
	PolicyOracle = "oracle"
)

// Policies lists every policy name accepted by Run.
var Policies = []string{PolicyRoundRobin, PolicyRandom, PolicyLeastRequest, PolicyCPUDistance, PolicyCapacity, PolicyTail, PolicyOracle, PolicyORCAWRR, PolicyPeakEWMA, PolicyPrequal, PolicyCPUShare}

// DefaultPolicies is what `adaptive-lb simulate` compares when no --policies is given.
var DefaultPolicies = []string{PolicyLeastRequest, PolicyCPUDistance, PolicyCPUShare, PolicyCapacity, PolicyTail}

// ValidatePolicy returns an error naming the allowed policies when name is unknown.
func ValidatePolicy(name string) error {
	for _, p := range Policies {
		if p == name {
			return nil
		}
	}
	return fmt.Errorf("policy %q is unknown; valid policies are %s", name, strings.Join(Policies, ", "))
}

// Options adjust one run.
type Options struct {
	// Settings overrides the engine settings of a controller policy; nil uses the defaults.
	Settings *weights.Settings
	// Progress, when set, is called with the fraction of simulated time done (0..1), a few
	// hundred times per run.
	Progress func(done float64)
	// StaticWeights, when set, gives every pod of a group a fixed weight from the start, with no
	// controller: how a hand-tuned ServiceEntry would behave.
	StaticWeights map[string]int
	// Metrics, when set, records the series a real mesh would expose for the run (export.go).
	// A recorder serves one run.
	Metrics *MetricsRecorder
	// seeInput, when set, is handed every cycle's engine input (tests).
	seeInput func(t float64, in weights.Input)
}

// request is one request in flight.
type request struct {
	sent  float64 // when the client issued it
	cost  float64 // CPU-seconds on reference hardware (speed 1)
	proxy int32
	pod   int32
	rif   int32 // requests in the pod when it arrived (Prequal's latency estimate)
}

// simulation is the state of one run. It is single-threaded; parallel runs use separate values.
type simulation struct {
	sc       *Scenario
	policy   string
	settings *weights.Settings // nil: no controller
	opts     Options

	q       scheduler
	arrRand *rand.Rand // arrivals, costs and proxy choice: identical across policies for a seed
	lbRand  *rand.Rand // balancer choices and scenario randomness
	// proxyDraw and workerDraw choose a request's client proxy and worker from arrRand.
	proxyDraw, workerDraw boundedInt
	// arrivals holds arrRand's draws for the next arrivals, drawn ahead (see drawArrivals);
	// nextDraw is the next one to use.
	arrivals []arrivalDraws
	nextDraw int
	// anyLognormal: some pod group's cost is lognormal, so the draws carry a normal quantile.
	anyLognormal bool

	end, warmup float64
	rps         float64
	// constantArrivals: the scenario's load comes at a fixed interval, not as a Poisson process.
	constantArrivals bool

	pods   []*pod
	groups [][]int32     // pod ids per group, in creation order
	costs  []costSampler // per group
	hosts  []int32       // pods in the host set, in creation order

	weightOf  map[int32]int // controller weights by pod id; empty until the first write
	balancers [][]*balancer // [proxy][worker]
	active    [][]int32     // [proxy][pod id] requests in flight as the proxy sees them
	reqs      []request
	free      []int32 // recycled request ids
	netHalf   float64
	// podLat counts the latencies (ms) of the requests sent after warm-up, per pod; the run's
	// own sketch is their merge (see result), with latencySum, their sum in completion order,
	// for its mean: one sketch less to fill per response.
	podLat     []latencySketch
	latencySum float64
	bucketLat  latencySketch // ms, every response in the current timeline bucket, warm-up included
	// Only with speed changes, for the recoveries: each warm latency (ms) and when it was
	// received (s), in completion order.
	keepLatencies bool
	latencies     []float32
	latencyAt     []float32
	timeline      []TimelinePoint
	totalSent     uint64

	// Controller state.
	snapCPU      [][]float64          // [pod id][second] cumulative CPU-seconds
	snapServed   [][]uint64           // [pod id][second] cumulative completions
	snapLatency  [][]latencyHistogram // [pod id][second] cumulative in-pod latency histogram
	pending      map[uint32]map[int32]int
	pendingWhy   map[uint32]string // the model's overrule behind a pending write, if any
	applySeq     uint32
	weightWrites int
	weightLog    []WeightPoint
	// lastApply is when the latest write reaches the clients, or did: a write decided at t
	// counts from t + apply delay as soon as it is made, as the operator counts its windows from
	// its last write; 0 before the first write.
	lastApply float64
	// modelDistrust is the tail algorithm's distrust of its model, carried from one cycle's
	// decision to the next as the operator carries it in its planner state and status.
	modelDistrust  float64
	modelOverrules int
	// lastObserved is the last cycle's input per pod id, and lastPeak its recent peak rate,
	// kept for the re-plan when endpoints leave (see replan).
	lastObserved map[int32]weights.Endpoint
	lastPeak     float64
	// planReplaced is set when a relief replaced the weights the last cycle planned from: as the
	// operator's mirror forgets that plan (Membership.ForgetPlan), no re-plan until the next cycle.
	planReplaced bool
	// snapFrom is, per pod id, the second of its first kept counters (snapCPU[id][0]).
	snapFrom []int
	// rateHistory is the Service's rate as each cycle of the last peakRateHorizon observed it.
	rateHistory []rateObservation
	// The check between cycles (fastcheck.go): how many writes it made, when it last cut each
	// pod, the relief behind a pending write, and every write that lowered a weight.
	reliefs    int
	relievedAt map[int32]float64
	// lastCutAt is when a write that cut a pod's weight for a jump or an overload (a relief, the
	// cycle's halving) reached the clients; pendingAnswers are the pods a pending write cuts so.
	lastCutAt      map[int32]float64
	pendingAnswers map[uint32][]int32
	pendingRelief  map[uint32]string
	cuts           []weightCut
	// started: a cycle has seen every pod of the initial fleet (onControl).
	started bool
	// known marks the pods whose weight came from their own metrics in an earlier cycle, as the
	// operator's planner counts them (cycle.Target.Known).
	known map[string]bool
	// The load history (history.go) and the tail algorithm's surge bound learned from it.
	history     weights.LoadHistory
	surgeFactor float64
	surge       *SurgeBound

	// Peers' client-side state, per proxy.
	peak     []peakEWMA
	orca     [][]orcaHost
	prequal  []prequalPool
	probeRTT float64

	warmCPU    []float64
	warmServed []uint64
	warmAt     []float64
	progressAt float64

	// recorder is opts.Metrics while it records this run; nil otherwise.
	recorder *MetricsRecorder
}

// Run simulates a scenario under one policy. It is deterministic for the scenario's seed.
func Run(sc *Scenario, policy string, opts Options) (*Result, error) {
	if err := ValidatePolicy(policy); err != nil {
		return nil, err
	}
	s := &simulation{
		sc:               sc,
		policy:           policy,
		opts:             opts,
		q:                newScheduler(),
		arrRand:          rand.New(rand.NewSource(sc.Seed)),
		lbRand:           rand.New(rand.NewSource(sc.Seed ^ 0x5eed)),
		end:              sc.Duration.Seconds(),
		warmup:           sc.Warmup.Seconds(),
		rps:              sc.Load.RPS,
		constantArrivals: sc.Load.Arrival == "constant",
		netHalf:          sc.Clients.NetworkLatency.Seconds() / 2,
		weightOf:         map[int32]int{},
		pending:          map[uint32]map[int32]int{},
		pendingWhy:       map[uint32]string{},
		pendingRelief:    map[uint32]string{},
		relievedAt:       map[int32]float64{},
		known:            map[string]bool{},
		lastCutAt:        map[int32]float64{},
		pendingAnswers:   map[uint32][]int32{},
		// The recoveries cut the latencies by time, which the sketches cannot.
		keepLatencies: len(speedChanges(sc)) > 0,
	}
	lb := sc.Clients.LB
	switch policy {
	case PolicyRoundRobin, PolicyRandom, PolicyLeastRequest:
		lb = policy
	case PolicyOracle:
		if len(opts.StaticWeights) == 0 {
			s.opts.StaticWeights = OracleWeights(sc)
		}
	case PolicyORCAWRR:
		lb = LBRoundRobin // weighted by the ORCA weights, refreshed every second
		s.orca = make([][]orcaHost, sc.Clients.Proxies)
	case PolicyPeakEWMA:
		s.peak = make([]peakEWMA, sc.Clients.Proxies)
	case PolicyPrequal:
		s.prequal = make([]prequalPool, sc.Clients.Proxies)
		s.probeRTT = sc.Clients.ProbeRTT.Seconds()
	default:
		st := weights.DefaultSettings(weights.Algorithm(policy))
		if opts.Settings != nil {
			st = *opts.Settings
		}
		if err := st.Validate(); err != nil {
			return nil, fmt.Errorf("engine settings for %s: %w", policy, err)
		}
		s.settings = &st
		s.learnSurge()
	}
	s.balancers = make([][]*balancer, sc.Clients.Proxies)
	s.proxyDraw, s.workerDraw = newBoundedInt(sc.Clients.Proxies), newBoundedInt(sc.Clients.Workers)
	s.active = make([][]int32, sc.Clients.Proxies)
	for p := range s.balancers {
		s.balancers[p] = make([]*balancer, sc.Clients.Workers)
		for w := range s.balancers[p] {
			s.balancers[p][w] = newBalancer(lb, sc.Clients.ChoiceCount, *sc.Clients.ActiveRequestBias)
		}
	}
	s.groups = make([][]int32, len(sc.Pods))
	for _, pg := range sc.Pods {
		s.costs = append(s.costs, newCostSampler(pg.Cost))
		s.anyLognormal = s.anyLognormal || s.costs[len(s.costs)-1].usesNormalQuantile()
	}
	for g, pg := range sc.Pods {
		for i := 0; i < pg.Replicas; i++ {
			s.addPod(g, 0)
		}
	}
	if len(s.opts.StaticWeights) > 0 {
		if s.settings != nil {
			return nil, fmt.Errorf("static weights and the %s controller exclude each other", policy)
		}
		for _, id := range s.hosts {
			w, ok := s.opts.StaticWeights[sc.Pods[s.pods[id].group].Name]
			if !ok || w < 1 {
				return nil, fmt.Errorf("static weights: pod group %q needs a weight of at least 1", sc.Pods[s.pods[id].group].Name)
			}
			s.weightOf[id] = w
		}
		s.logWeights(0, "")
	}
	if policy == PolicyCapacity || policy == PolicyTail {
		// The operator's mirror writes every endpoint at the equal weight before any cycle:
		// a membership write, not a weight write. Envoy balances equal weights as unweighted.
		for _, id := range s.hosts {
			s.weightOf[id] = s.settings.EqualWeight()
		}
		s.logWeights(0, "")
	}
	if policy == PolicyCPUDistance || policy == PolicyCPUShare {
		// The published operator's first act is to write every endpoint at 1000; its rules then
		// start from that, not from Envoy's default of 1.
		for _, id := range s.hosts {
			s.weightOf[id] = publishedStartWeight
		}
		s.weightWrites++
		s.logWeights(0, "")
	}
	s.refreshBalancers()
	if s.warmup == 0 {
		s.markWarm(0)
	}
	if err := s.startRecording(); err != nil {
		return nil, err
	}
	s.schedule()
	if err := s.loop(); err != nil {
		return nil, err
	}
	return s.result(), nil
}

func (s *simulation) schedule() {
	s.q.setArrival(s.firstArrival())
	s.drawArrivals()
	for i, ph := range s.sc.Load.Phases {
		s.q.push(ph.At.Seconds(), evPhase, int32(i), 0)
	}
	for g, pg := range s.sc.Pods {
		for j, ev := range pg.Events {
			s.q.push(ev.At.Seconds(), evPodEvent, int32(g), uint32(j))
		}
	}
	for t := 1.0; t <= s.end; t++ {
		s.q.push(t, evSnapshot, 0, 0)
	}
	if s.settings != nil {
		s.scheduleFastChecks()
		iv := s.sc.Controller.Interval.Seconds()
		for t := iv; t <= s.end; t += iv {
			s.q.push(t, evControl, 0, 0)
		}
	}
}

// firstArrival is when the first client request is issued.
func (s *simulation) firstArrival() float64 {
	if s.constantArrivals {
		return 1 / s.rps
	}
	return s.arrRand.ExpFloat64() / s.rps
}

// arrivalDraws are what one arrival draws from arrRand, in the order it draws them: the gap to
// the next arrival before the request is sent (Poisson arrivals only), then the request's
// uniform cost draw, client proxy and worker.
type arrivalDraws struct {
	gap           float64 // exponential, of mean 1: the next arrival comes gap/rps later
	u             float64 // uniform in [0, 1): the request's cost
	z             float64 // normalQuantile(u), when some group's cost is lognormal
	proxy, worker int32
}

// arrivalBatch is how many arrivals' draws drawArrivals makes at once.
const arrivalBatch = 256

// drawArrivals draws the next arrivalBatch arrivals' numbers from arrRand. Only arrivals draw
// from it, and they draw the same whatever else happens, so drawing ahead gives every arrival
// the numbers it would have drawn itself. The normal quantiles are worked out in a loop of
// their own: math.Erfinv is a long chain of dependent floating-point operations, and chains of
// different arrivals side by side overlap in the processor, where one per arrival, amid the
// rest of the work, stalls it.
func (s *simulation) drawArrivals() {
	if s.arrivals == nil {
		s.arrivals = make([]arrivalDraws, arrivalBatch)
	}
	for i := range s.arrivals {
		d := &s.arrivals[i]
		if !s.constantArrivals {
			d.gap = s.arrRand.ExpFloat64()
		}
		d.u = s.arrRand.Float64()
		d.proxy = int32(s.proxyDraw.draw(s.arrRand))
		d.worker = int32(s.workerDraw.draw(s.arrRand))
	}
	if s.anyLognormal {
		for i := range s.arrivals {
			s.arrivals[i].z = normalQuantile(s.arrivals[i].u)
		}
	}
	s.nextDraw = 0
}

func (s *simulation) loop() error {
	for {
		src, t, key := s.q.earliest()
		if !(t <= s.end) { // past the end, or nothing pending (+Inf)
			break
		}
		switch src {
		case srcArrival:
			s.q.dropArrival()
			s.onArrival(t)
		case srcHop:
			if ev := s.q.takeHop(); ev.kind() == evPodArrive {
				s.onPodArrive(t, ev.a)
			} else {
				s.onResponse(t, ev.a)
			}
		case srcWake:
			// The wake stays in the tree until the pod moves or cancels it, which onPodWake
			// always does (it ends in rewake); the tree never holds a stale wake.
			s.onPodWake(t, s.pods[wakePod(key)])
		default:
			if err := s.onRareEvent(s.q.takeRare()); err != nil {
				return err
			}
		}
	}
	s.settle(s.end)
	return nil
}

// onRareEvent handles an event that is neither an arrival, a network hop nor a pod wake.
func (s *simulation) onRareEvent(ev event) error {
	switch ev.kind() {
	case evControl:
		return s.onControl(ev.t)
	case evFastCheck:
		return s.onFastCheck(ev.t)
	case evApply:
		s.onApply(ev.t, ev.b)
	case evPodEvent:
		s.onPodEvent(ev.t, int(ev.a), int(ev.b))
	case evRestartStep:
		s.onRestartStep(ev.t, int(ev.a), int(ev.b))
	case evPhase:
		s.rps = s.sc.Load.Phases[ev.a].RPS
	case evSnapshot:
		s.onSnapshot(ev.t)
		if s.orca != nil {
			s.refreshORCA(ev.t)
		}
	case evProbe:
		s.onProbe(ev.t, int(ev.a), int32(ev.b))
	}
	return nil
}

func (s *simulation) addPod(group int, now float64) *pod {
	pg := s.sc.Pods[group]
	id := int32(len(s.pods))
	if id >= maxPods {
		panic(fmt.Sprintf("sim: more than %d pods in one run", maxPods))
	}
	p := &pod{
		id:        id,
		name:      fmt.Sprintf("%s-%d", pg.Name, len(s.groups[group])),
		group:     group,
		speed:     pg.Speed,
		cores:     pg.Cores,
		workers:   pg.Workers,
		limit:     pg.CPULimit,
		quota:     pg.CPULimit * cfsPeriod,
		inHostSet: true,
		born:      now,
		lastT:     now,
		minFinish: math.Inf(1),
		wakeAt:    -1,
		// CFS periods start when the cgroup's timer does: not aligned across pods.
		periodEnd: now + cfsPeriod*(0.05+0.95*s.lbRand.Float64()),
	}
	s.pods = append(s.pods, p)
	s.groups[group] = append(s.groups[group], id)
	s.hosts = append(s.hosts, id)
	for i := range s.active {
		s.active[i] = append(s.active[i], 0)
	}
	s.podLat = append(s.podLat, latencySketch{})
	s.snapCPU = append(s.snapCPU, nil)
	s.snapServed = append(s.snapServed, nil)
	s.snapLatency = append(s.snapLatency, nil)
	s.snapFrom = append(s.snapFrom, 0)
	if w, ok := s.opts.StaticWeights[pg.Name]; ok {
		s.weightOf[id] = w
	} else if s.policy == PolicyCPUShare && len(s.weightOf) > 0 {
		var current []int
		for _, h := range s.hosts {
			if w, ok := s.weightOf[h]; ok {
				current = append(current, w)
			}
		}
		s.weightOf[id] = weights.CPUShareNewWeight(current, *s.settings)
	} else if s.settings != nil && len(s.weightOf) > 0 {
		// The mirror writes a new endpoint at once with the median weight of the pods on the
		// same hardware (the operator reads the node's instance type; here, the pod group), or
		// of all pods when it has no such peer.
		s.weightOf[id] = s.medianWeight(func(h int32) bool { return s.pods[h].group == group })
		if s.weightOf[id] == 0 {
			s.weightOf[id] = s.medianWeight(func(int32) bool { return true })
		}
	}
	return p
}

func (s *simulation) removePod(id int32) {
	s.pods[id].inHostSet = false
	for i, h := range s.hosts {
		if h == id {
			s.hosts = append(s.hosts[:i], s.hosts[i+1:]...)
			break
		}
	}
	delete(s.weightOf, id)
}

// medianWeight returns the median weight of the weighted hosts that match, 0 if none does.
func (s *simulation) medianWeight(match func(int32) bool) int {
	var ws []int
	for _, h := range s.hosts {
		if w, ok := s.weightOf[h]; ok && match(h) {
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		return 0
	}
	sort.Ints(ws)
	return ws[len(ws)/2]
}

// refreshBalancers pushes the host set and weights to every client worker, like an EDS update.
func (s *simulation) refreshBalancers() {
	ws := make([]float64, len(s.hosts))
	for i, h := range s.hosts {
		ws[i] = 1
		if w, ok := s.weightOf[h]; ok {
			ws[i] = float64(w)
		}
	}
	for p, workers := range s.balancers {
		for _, b := range workers {
			b.refresh(s.hosts, ws, s.active[p], s.lbRand)
		}
	}
}

// normalQuantile is the standard normal quantile of u in [0, 1): √2·erf⁻¹(2u-1), with exactly
// math.Erfinv's bits. math.Erfinv(x) works on |x| and negates its result when x < 0, behind a
// branch that a uniform draw makes a coin toss for the predictor; passing |x| keeps that branch
// one way, and setting the sign bit afterwards (math.Copysign, no branch) gives the same result.
func normalQuantile(u float64) float64 {
	x := 2*u - 1
	return math.Sqrt2 * math.Copysign(math.Erfinv(math.Abs(x)), x)
}

func (s *simulation) onArrival(t float64) {
	if s.nextDraw == len(s.arrivals) {
		s.drawArrivals()
	}
	d := &s.arrivals[s.nextDraw]
	s.nextDraw++
	if s.constantArrivals {
		s.q.setArrival(t + 1/s.rps)
	} else {
		s.q.setArrival(t + d.gap/s.rps)
	}
	proxy, worker := int(d.proxy), int(d.worker)
	if len(s.hosts) == 0 {
		return // no endpoint: the request fails fast (503) and is not a latency sample
	}
	var podID int32
	switch {
	case s.peak != nil:
		podID = s.peak[proxy].pick(s.hosts, s.active[proxy], t, s.lbRand)
	case s.prequal != nil:
		s.sendProbes(t, proxy)
		id, ok := s.prequal[proxy].pick(t, func(pod int32) bool { return s.pods[pod].inHostSet })
		if !ok {
			id = s.hosts[s.lbRand.Intn(len(s.hosts))]
		}
		podID = id
	default:
		podID = s.balancers[proxy][worker].pick(s.active[proxy], s.lbRand)
	}
	var id int32
	if n := len(s.free); n > 0 {
		id = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		id = int32(len(s.reqs))
		s.reqs = append(s.reqs, request{})
	}
	s.reqs[id] = request{sent: t, cost: s.costs[s.pods[podID].group].cost(d.u, d.z), proxy: int32(proxy), pod: podID}
	s.active[proxy][podID]++
	s.totalSent++
	s.q.pushHop(t+s.netHalf, evPodArrive, id)
}

func (s *simulation) onPodArrive(t float64, id int32) {
	p := s.pods[s.reqs[id].pod]
	p.advance(t)
	s.reqs[id].rif = int32(p.inSystem())
	if len(p.running) < p.workers {
		p.start(id, s.reqs[id].cost)
	} else {
		p.queue = append(p.queue, id)
	}
	s.rewake(p)
}

func (s *simulation) rewake(p *pod) {
	w := p.nextWake()
	if math.IsInf(w, 1) {
		p.wakeAt = -1
		s.q.cancelWake(p.id)
		return
	}
	if w == p.wakeAt {
		return // the pending wake is still right
	}
	p.wakeAt = w
	s.q.setWake(p.id, w)
}

func (s *simulation) onPodWake(t float64, p *pod) {
	p.advance(t)
	// Complete every request whose work is done (several can finish together).
	const eps = completionSlack
	kept := p.running[:0]
	p.minFinish = math.Inf(1)
	for _, r := range p.running {
		if r.finish > p.vwork+eps {
			kept = append(kept, r)
			p.minFinish = min(p.minFinish, r.finish)
			continue
		}
		id := r.id
		p.served++
		inPod := t - s.reqs[id].sent - s.netHalf
		p.latencies.observe(inPod * 1000)
		p.latencySumMS += inPod * 1000
		if s.prequal != nil {
			p.recordRIFLatency(int(s.reqs[id].rif), inPod)
		}
		s.q.pushHop(t+s.netHalf, evResponse, id)
	}
	p.running = kept
	for len(p.running) < p.workers && p.qhead < len(p.queue) {
		id := p.queue[p.qhead]
		p.start(id, s.reqs[id].cost)
		p.qhead++
	}
	if p.qhead == len(p.queue) {
		p.queue, p.qhead = p.queue[:0], 0
	} else if p.qhead > 1024 && p.qhead*2 > len(p.queue) {
		p.queue = append(p.queue[:0], p.queue[p.qhead:]...)
		p.qhead = 0
	}
	// A completion may have happened exactly at quota exhaustion: re-check throttling.
	p.advance(t)
	// The wake that fired is still in the scheduler's tree: rewake must move or cancel it,
	// even to the same time, or it would fire again.
	p.wakeAt = -1
	s.rewake(p)
}

func (s *simulation) onResponse(t float64, id int32) {
	r := s.reqs[id]
	s.active[r.proxy][r.pod]--
	switch {
	case s.peak != nil:
		s.peak[r.proxy].observe(r.pod, t, t-r.sent)
	case s.orca != nil:
		s.orcaReport(t, int(r.proxy), r.pod)
	}
	ms := float32((t - r.sent) * 1000)
	if s.recorder != nil {
		s.recorder.observeClient(r.proxy, float64(t-r.sent)*1000)
	}
	bucket := sketchIndex(ms)
	s.bucketLat.addAt(bucket, ms)
	if r.sent >= s.warmup {
		s.podLat[r.pod].addAt(bucket, ms)
		s.latencySum += float64(ms)
		if s.keepLatencies {
			s.latencies = append(s.latencies, ms)
			s.latencyAt = append(s.latencyAt, float32(t))
		}
	}
	s.free = append(s.free, id)
}

func (s *simulation) onSnapshot(t float64) {
	for _, p := range s.pods {
		p.advance(t)
		if len(s.snapCPU[p.id]) == 0 {
			s.snapFrom[p.id] = int(t)
		}
		s.snapCPU[p.id] = append(s.snapCPU[p.id], p.cpu)
		s.snapServed[p.id] = append(s.snapServed[p.id], p.served)
		s.snapLatency[p.id] = append(s.snapLatency[p.id], p.latencies)
	}
	if s.recorder != nil {
		s.recorder.maybeScrape(s, t)
	}
	if int(t)%timelineBucket == 0 {
		s.timeline = append(s.timeline, TimelinePoint{TimeS: t, P50: s.bucketLat.quantile(0.5), P99: s.bucketLat.quantile(0.99), RPS: float64(s.bucketLat.n) / timelineBucket})
		s.bucketLat.reset()
	}
	if s.warmAt == nil && t >= s.warmup {
		s.markWarm(t)
	}
	if s.opts.Progress != nil && t-s.progressAt >= s.end/200 {
		s.progressAt = t
		s.opts.Progress(t / s.end)
	}
}

func (s *simulation) markWarm(t float64) {
	s.warmAt = make([]float64, len(s.pods))
	s.warmCPU = make([]float64, len(s.pods))
	s.warmServed = make([]uint64, len(s.pods))
	for i, p := range s.pods {
		s.warmAt[i] = t
		s.warmCPU[i] = p.cpu
		s.warmServed[i] = p.served
	}
}

// publishedStartWeight is the weight the published operator writes for every endpoint before
// its first cycle.
const publishedStartWeight = 1000

func (s *simulation) onControl(t float64) error {
	eps := make([]weights.Endpoint, 0, len(s.hosts))
	ids := make([]int32, 0, len(s.hosts))
	serviceRate, rateObserved := 0.0, false
	for _, h := range s.hosts {
		o := s.observe(s.pods[h], t)
		cur := s.writtenWeight(h)
		eps = append(eps, weights.Endpoint{
			ID:                s.pods[h].name,
			CPUCores:          o.cpu,
			CPULimitCores:     s.pods[h].limit,
			RequestRate:       o.rps,
			LatencyP99Seconds: o.p99,
			HasMetrics:        o.hasMetrics,
			CurrentWeight:     cur,
			NodeCPUCores:      s.pods[h].cores,
			LatencyBuckets:    o.buckets,
			Relieved:          s.relieved(h, t),
			OverloadAnswered:  s.overloadAnswered(h, t),
		})
		ids = append(ids, h)
		if o.rateUsable {
			serviceRate += o.rps
			rateObserved = true
		}
	}
	if !s.started {
		// The operator starts on pods that have run for a while: the TSDB holds their rates. The
		// simulated fleet starts at 0 with none, and a cycle that read only the pods whose first
		// scrapes happened to fall early would plan the others blind: the controller starts at
		// the first cycle that sees every pod of the fleet it started with.
		for i, h := range ids {
			if s.pods[h].born == 0 && !eps[i].HasMetrics {
				return nil
			}
		}
		s.started = true
	}
	s.lastObserved = make(map[int32]weights.Endpoint, len(ids))
	s.planReplaced = false
	for i, h := range ids {
		s.lastObserved[h] = eps[i]
	}
	s.lastPeak = s.recordPeak(t, serviceRate, rateObserved)
	in := weights.Input{
		Endpoints:             eps,
		WindowCoverage:        s.windowCoverage(t),
		WindowSeconds:         s.sc.Controller.Window.Seconds(),
		RecentPeakRequestRate: s.lastPeak,
		ProjectedRequestRate:  s.projectedRate(),
		ModelDistrust:         s.modelDistrust,
		SurgeFactor:           s.surgeFactor,
		LoadHistory:           s.history,
	}
	if s.opts.seeInput != nil {
		s.opts.seeInput(t, in)
	}
	d, err := weights.Compute(in, *s.settings)
	if err != nil {
		return fmt.Errorf("controller at t=%.0fs: %w", t, err)
	}
	if a := s.settings.Algorithm; a == weights.AlgorithmCapacity || a == weights.AlgorithmTail {
		// The operator's planner decides the endpoints without metrics (cycle.Plan): a known
		// one keeps its weight, a new one takes its instance type's (here: its pod group's).
		peers := make(map[string]string, len(ids))
		for _, h := range ids {
			peers[s.pods[h].name] = s.sc.Pods[s.pods[h].group].Name
		}
		cycle.KeepWithoutMetrics(&d, eps, *s.settings, peers, s.known)
		for _, ep := range eps {
			if ep.HasMetrics {
				s.known[ep.ID] = true
			}
		}
	}
	s.modelDistrust = d.ModelDistrust
	if d.ModelOverruled != "" {
		s.modelOverrules++
	}
	if !d.Changed {
		return nil
	}
	next := make(map[int32]int, len(ids))
	for i, r := range d.Endpoints {
		next[ids[i]] = r.Weight
	}
	s.scheduleApply(t, next, s.dataMidpoint(t, s.sc.Controller.Window.Seconds()))
	for i, r := range d.Endpoints {
		if r.Reason == weights.ReasonOverloaded {
			s.pendingAnswers[s.applySeq] = append(s.pendingAnswers[s.applySeq], ids[i])
		}
	}
	if d.ModelOverruled != "" {
		s.pendingWhy[s.applySeq] = d.ModelOverruled
	}
	return nil
}

// projectedRate extrapolates the Service's rate, as the last trendWindows cycles observed it, to
// when the weights decided now will have been replaced: half a window (a window's average lags
// its end), the TSDB's latency offset, the next cycle and the push. The operator fills
// weights.Input.ProjectedRequestRate the same way from its rate history.
func (s *simulation) projectedRate() float64 {
	h := s.rateHistory[max(0, len(s.rateHistory)-trendWindows):]
	samples := make([]weights.RateSample, len(h))
	for i, o := range h {
		samples[i] = weights.RateSample{EndSeconds: o.at, Rate: o.rate}
	}
	return weights.ProjectRequestRate(samples, s.reactionSeconds())
}

// trendWindows is how many cycles' observations the rate trend is fitted over.
const trendWindows = 3

// writtenWeight is the weight of pod h in the controller's latest write, which may not have
// reached the clients yet: what the operator reads back from the ServiceEntry it wrote.
func (s *simulation) writtenWeight(h int32) int {
	if next, ok := s.pending[s.applySeq]; ok {
		if w, ok := next[h]; ok {
			return w
		}
	}
	return s.weightOf[h]
}

// scheduleApply counts a weight write decided at t and has it reach the clients after the apply
// delay, as the operator's ServiceEntry write reaches them through istiod.
func (s *simulation) scheduleApply(t float64, next map[int32]int, basis float64) {
	s.noteCuts(t, basis, next)
	s.lastApply = t + s.sc.Controller.ApplyDelay.Seconds()
	s.applySeq++
	s.pending[s.applySeq] = next
	s.weightWrites++
	s.q.push(t+s.sc.Controller.ApplyDelay.Seconds(), evApply, 0, s.applySeq)
}

// replan re-decides the survivors' weights when endpoints leave, as the operator's endpoint
// mirror does in the ServiceEntry write that drops them. It runs the engine on the last cycle's
// observations of the endpoints still in the host set, with the weights that were in force over
// that window (so that two departures before the next cycle re-plan from the same basis), and the
// fleet's recent peak rate, which still holds the departed pods' traffic: the whole load is
// planned over fewer pods. The settle rules do not apply (weights.Input.Replan); every bound
// does, and so does the dead band: a change too small to move traffic is not written. There is
// no re-plan while a pod that joined since the last cycle is in the host set (a rolling
// restart's replacement, a scale-up): the lost capacity is being replaced, the newcomer has no
// observation to plan with, and a plan without it would shift its share onto the others; the
// newcomer keeps the weight the mirror gave it. The published operator's baselines do not
// re-plan: their source reacts only in its cycle. The new weights reach the clients after the
// apply delay, like the mirror's write; a re-plan that changes a weight counts as a weight write.
func (s *simulation) replan(t float64) {
	if s.settings == nil || len(s.lastObserved) == 0 || s.planReplaced {
		return
	}
	if a := s.settings.Algorithm; a != weights.AlgorithmCapacity && a != weights.AlgorithmTail {
		return
	}
	eps := make([]weights.Endpoint, 0, len(s.hosts))
	ids := make([]int32, 0, len(s.hosts))
	current := make([]int, 0, len(s.hosts))
	for _, h := range s.hosts {
		ep, ok := s.lastObserved[h]
		if !ok {
			return
		}
		eps = append(eps, ep)
		ids = append(ids, h)
		current = append(current, s.writtenWeight(h))
	}
	d, err := weights.Compute(weights.Input{Endpoints: eps, WindowCoverage: 1, WindowSeconds: s.sc.Controller.Window.Seconds(), RecentPeakRequestRate: s.lastPeak, ModelDistrust: s.modelDistrust, Replan: true, SurgeFactor: s.surgeFactor, LoadHistory: s.history}, *s.settings)
	if err != nil || !d.Changed {
		// An error leaves the weights as they are (the last cycle's input was accepted). An
		// unchanged decision returns the basis, the weights of the last cycle's window: writing
		// it would undo that cycle's write.
		return
	}
	changed := false
	next := make(map[int32]int, len(ids))
	for i, r := range d.Endpoints {
		next[ids[i]] = r.Weight
		if r.Weight != current[i] {
			changed = true
		}
	}
	if !changed {
		return
	}
	// A re-plan stands on the last cycle's data: it reacts to a departure, never to a slowdown.
	s.scheduleApply(t, next, math.Inf(-1))
}

func (s *simulation) onApply(t float64, seq uint32) {
	next := s.pending[seq]
	delete(s.pending, seq)
	why := s.pendingWhy[seq]
	delete(s.pendingWhy, seq)
	relief := s.pendingRelief[seq]
	delete(s.pendingRelief, seq)
	applied := make(map[int32]int, len(s.hosts))
	for _, h := range s.hosts {
		if w, ok := next[h]; ok {
			applied[h] = w
		}
	}
	previous := s.weightOf
	s.weightOf = applied
	for _, h := range s.pendingAnswers[seq] {
		s.lastCutAt[h] = t
	}
	delete(s.pendingAnswers, seq)
	// Pods that joined after the decision keep the weight the mirror gave them.
	for _, h := range s.hosts {
		if _, ok := s.weightOf[h]; !ok {
			if w, ok := previous[h]; ok {
				s.weightOf[h] = w
			} else {
				s.weightOf[h] = max(1, s.medianWeight(func(int32) bool { return true }))
			}
		}
	}
	s.logWeights(t, why)
	s.weightLog[len(s.weightLog)-1].Relief = relief
	s.refreshBalancers()
}

func (s *simulation) logWeights(t float64, overruled string) {
	wp := WeightPoint{TimeS: t, Weights: map[string]int{}, ModelOverruled: overruled}
	for _, h := range s.hosts {
		wp.Weights[s.pods[h].name] = s.weightOf[h]
	}
	s.weightLog = append(s.weightLog, wp)
}

func (s *simulation) onPodEvent(t float64, g, j int) {
	ev := s.sc.Pods[g].Events[j]
	switch {
	case ev.Speed != nil:
		for _, id := range s.groups[g] {
			p := s.pods[id]
			if !p.inHostSet && p.inSystem() == 0 {
				continue
			}
			p.advance(t)
			p.setSpeed(*ev.Speed)
			p.wakeAt = -1
			s.rewake(p)
		}
	case ev.Replicas != nil:
		live := s.liveIn(g)
		for len(live) < *ev.Replicas {
			live = append(live, s.addPod(g, t).id)
		}
		removed := false
		for len(live) > *ev.Replicas {
			s.removePod(live[len(live)-1])
			live = live[:len(live)-1]
			removed = true
		}
		s.refreshBalancers()
		if removed {
			s.replan(t)
		}
	case ev.Restart != nil:
		s.q.push(t, evRestartStep, int32(g), 0)
	}
}

// onRestartStep replaces the step-th pod of a rolling restart: the new pod joins, then the old
// one leaves (maxSurge 1, maxUnavailable 0); in-flight requests on the old pod complete.
func (s *simulation) onRestartStep(t float64, g, step int) {
	live := s.liveIn(g)
	if step >= len(live) {
		return
	}
	old := live[0]
	s.addPod(g, t)
	s.removePod(old)
	s.refreshBalancers()
	s.replan(t)
	if step+1 < len(live) {
		var every float64
		for _, ev := range s.sc.Pods[g].Events {
			if ev.Restart != nil {
				every = ev.Restart.Seconds()
			}
		}
		s.q.push(t+every, evRestartStep, int32(g), uint32(step+1))
	}
}

func (s *simulation) liveIn(g int) []int32 {
	var live []int32
	for _, id := range s.groups[g] {
		if s.pods[id].inHostSet {
			live = append(live, id)
		}
	}
	return live
}

func (s *simulation) settle(t float64) {
	for _, p := range s.pods {
		p.advance(t)
	}
	if s.warmAt == nil {
		s.markWarm(s.warmup)
	}
}

var errNoSamples = errors.New("no request completed after warm-up; lengthen the run or the load")

// OracleWeights returns, per pod group, a weight proportional to the group's true capacity at
// the start of the run: CPU (its limit, or its cores when unlimited) × speed / mean cost. The
// largest group gets 1000. Speed changes during the run are not followed: the oracle knows the
// hardware, not the future.
func OracleWeights(sc *Scenario) map[string]int {
	capacity := make(map[string]float64, len(sc.Pods))
	hi := 0.0
	for _, p := range sc.Pods {
		cpu := p.CPULimit
		if cpu == 0 || cpu > p.Cores {
			cpu = p.Cores
		}
		c := cpu * p.Speed / p.Cost.Mean.Seconds()
		capacity[p.Name] = c
		hi = math.Max(hi, c)
	}
	out := make(map[string]int, len(capacity))
	for name, c := range capacity {
		out[name] = max(1, int(math.Round(1000*c/hi)))
	}
	return out
}

// orcaReportWindow is the span a server averages its utilization and request rate over before
// reporting them; servers smooth their ORCA metrics, and a single second is mostly noise.
const orcaReportWindow = 5

// orcaReport records the load report a response carries: the pod's CPU utilization and request
// rate over the last orcaReportWindow whole seconds, as an ORCA-instrumented server reports them.
func (s *simulation) orcaReport(t float64, proxy int, pod int32) {
	cpus, served := s.snapCPU[pod], s.snapServed[pod]
	if len(cpus) < 2 {
		return
	}
	span := min(orcaReportWindow, len(cpus)-1)
	p := s.pods[pod]
	capacity := p.cores
	if p.limit > 0 && p.limit < capacity {
		capacity = p.limit
	}
	for len(s.orca[proxy]) <= int(pod) {
		s.orca[proxy] = append(s.orca[proxy], orcaHost{nonEmptySince: -1})
	}
	h := &s.orca[proxy][pod]
	n := len(cpus)
	h.utilization = (cpus[n-1] - cpus[n-1-span]) / capacity / float64(span)
	h.qps = float64(served[n-1]-served[n-1-span]) / float64(span)
	if h.nonEmptySince < 0 || t-h.lastUpdate > orcaExpiration {
		h.nonEmptySince = t
	}
	h.lastUpdate = t
}

// refreshORCA recomputes every proxy's weights, as Envoy does every weight_update_period.
func (s *simulation) refreshORCA(t float64) {
	for proxy, workers := range s.balancers {
		raw := make([]float64, len(s.hosts))
		for i, h := range s.hosts {
			if int(h) < len(s.orca[proxy]) {
				raw[i] = orcaWeight(s.orca[proxy][h], t)
			}
		}
		ws := orcaWeights(raw)
		for _, b := range workers {
			b.refresh(s.hosts, ws, s.active[proxy], s.lbRand)
		}
	}
}

// sendProbes sends a query's Prequal probes to random replicas; each comes back after probeRTT.
func (s *simulation) sendProbes(t float64, proxy int) {
	for i := 0; i < prequalProbes; i++ {
		pod := s.hosts[s.lbRand.Intn(len(s.hosts))]
		s.q.pushProbe(t+s.probeRTT, int32(proxy), uint32(pod))
	}
}

// onProbe files a probe's answer, read when it left the replica: its requests in flight and its
// latency estimate. Probes cost the replica no CPU.
func (s *simulation) onProbe(t float64, proxy int, pod int32) {
	p := s.pods[pod]
	s.prequal[proxy].add(prequalProbe{pod: pod, rif: p.inSystem(), latency: p.estimateLatency(), at: t})
}
