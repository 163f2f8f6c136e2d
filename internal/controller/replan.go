package controller

import (
	"maps"
	"slices"
	"sync"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/types"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/cycle"
	"github.com/adaptive-lb/adaptive-lb/internal/mesh/istio"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// lastPlans keeps, per AdaptiveLoadBalancer, what the last weight cycle gave the engine, so that
// the mirror can re-plan the survivors' weights when endpoints leave (replanWeights). It lives
// beside the membership records because the mirror and the cycle both reach those.
type lastPlans struct {
	mu    sync.Mutex
	byKey map[types.NamespacedName]lastPlan
}

type lastPlan struct {
	uid types.UID // the AdaptiveLoadBalancer's: a new one of the same name starts afresh
	// generation is the spec's the cycle planned for: after a spec change (another target
	// Service, other queries or bounds) the observations may not be the ones it asks for.
	generation int64
	at         time.Time
	window     time.Duration
	target     cycle.Target
	// distrust is the tail model's distrust the cycle decided with (cycle.State.ModelDistrust):
	// a re-plan soon after an overrule must not return to the split the measurement threw out.
	distrust float64
	// replannedWeights are the weights the last re-plan wrote, by IP, until the next cycle
	// records its plan: the mirror's status names them as re-planned.
	replannedWeights map[string]uint32
	// beforeReplan are the weights of every pod listed before the last re-plan, until the next
	// cycle records its plan: when the pods that left are all back, the re-plan is undone
	// (undoReplan).
	beforeReplan appliedWeights
}

// Replanned records that the mirror's write of re-planned weights for key (byIP) has landed,
// replacing the weights before (by pod). It serves the status and the undo of the re-plan: what
// the weight cycle must know of a re-plan (that one was written, and when) is on the
// ServiceEntry itself (ReplannedAtAnnotation), in the same write. An undone re-plan (before
// nil) leaves nothing to undo.
func (m *Membership) Replanned(key types.NamespacedName, byIP map[string]uint32, before appliedWeights) {
	if m == nil {
		return
	}
	m.plans.mu.Lock()
	defer m.plans.mu.Unlock()
	if p, ok := m.plans.byKey[key]; ok {
		p.replannedWeights, p.beforeReplan = byIP, before
		if before == nil {
			p.replannedWeights = nil
		}
		m.plans.byKey[key] = p
	}
}

// undoReplan returns, by pod name, the weights the pods had before the last re-plan of alb when
// every pod that re-plan answered the leaving of is back and the ServiceEntry lists exactly the
// pods it listed then (built), with no weight cycle planned since; and when it is. Otherwise nil.
// A pod whose readiness flaps would otherwise ratchet its peers' weights: each departure
// re-plans them up from the last re-plan's weights, and nothing brings them down when it
// returns, until the weight cycle's own slower steps do.
func (m *Membership) undoReplan(alb *adlbv1.AdaptiveLoadBalancer, built []istio.Endpoint) (map[string]uint32, time.Time) {
	if m == nil || alb.Spec.Mode == adlbv1.ModeDryRun || alb.Spec.Mode == adlbv1.ModeFrozen {
		return nil, time.Time{}
	}
	key := types.NamespacedName{Namespace: alb.Namespace, Name: alb.Name}
	m.plans.mu.Lock()
	plan, ok := m.plans.byKey[key]
	m.plans.mu.Unlock()
	if !ok || plan.beforeReplan == nil || plan.uid != alb.UID || plan.generation != alb.Generation {
		return nil, time.Time{}
	}
	listed := map[string]bool{}
	for _, e := range built {
		if _, was := plan.beforeReplan[e.Pod]; !was {
			return nil, time.Time{} // a newcomer: not the membership the re-plan left
		}
		listed[e.Pod] = true
	}
	if len(listed) != len(plan.beforeReplan) {
		return nil, time.Time{}
	}
	m.mu.Lock()
	now := m.clock.Now()
	m.mu.Unlock()
	return maps.Clone(plan.beforeReplan), now
}

// ReplannedWeight reports whether weight is what the last re-plan of key wrote for ip, with no
// weight cycle recorded since.
func (m *Membership) ReplannedWeight(key types.NamespacedName, ip string, weight uint32) bool {
	if m == nil {
		return false
	}
	m.plans.mu.Lock()
	defer m.plans.mu.Unlock()
	w, ok := m.plans.byKey[key].replannedWeights[ip]
	return ok && w == weight
}

// RecordPlan keeps a cycle's input to the engine for alb (endpoint IDs are IPs). Only inputs the
// engine planned from count: a target whose metrics failed keeps no plan, so no re-plan happens
// during a hold or a fallback.
func (m *Membership) RecordPlan(alb *adlbv1.AdaptiveLoadBalancer, window time.Duration, t cycle.Target, distrust float64) {
	if m == nil {
		return
	}
	key, uid := types.NamespacedName{Namespace: alb.Namespace, Name: alb.Name}, alb.UID
	m.mu.Lock()
	at := m.clock.Now() // the mirror reads the plan's age on the same clock
	m.mu.Unlock()
	m.plans.mu.Lock()
	defer m.plans.mu.Unlock()
	if t.MetricsErr != nil {
		// No observations to re-plan from.
		if prev, ok := m.plans.byKey[key]; ok {
			prev.target, prev.at = cycle.Target{}, time.Time{}
			m.plans.byKey[key] = prev
		}
		return
	}
	if m.plans.byKey == nil {
		m.plans.byKey = map[types.NamespacedName]lastPlan{}
	}
	m.plans.byKey[key] = lastPlan{uid: uid, generation: alb.Generation, at: at, window: window, target: t, distrust: distrust}
}

// listedThroughout reports whether every pod of stay (by IP) has been in the ServiceEntry since
// before at, at the same address. The plan's observations are keyed by IP: an address that left
// and came back, or that another pod took over, carries observations of a pod that is not there.
func (m *Membership) listedThroughout(key types.NamespacedName, stay map[string]string, at time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	log, ok := m.byKey[key]
	if !ok {
		return false
	}
	for ip, pod := range stay {
		since, in := log.in[ip]
		if !in || since.After(at) || log.weight[ip].pod != pod {
			return false
		}
	}
	return true
}

// ForgetPlan drops the plan recorded for key: the weights it planned from are no longer the ones
// in force (a relief between cycles replaced them), so no re-plan happens until the next cycle
// records one; endpoints that leave meanwhile leave the others' weights as they are.
func (m *Membership) ForgetPlan(key types.NamespacedName) {
	if m == nil {
		return
	}
	m.forgetPlans(func(k types.NamespacedName) bool { return k != key })
}

func (m *Membership) forgetPlans(keep func(types.NamespacedName) bool) {
	m.plans.mu.Lock()
	defer m.plans.mu.Unlock()
	for key := range m.plans.byKey {
		if !keep(key) {
			delete(m.plans.byKey, key)
		}
	}
}

// replanWeights re-plans the weights of the endpoints that stay when endpoints leave the
// ServiceEntry, for the mirror to write in the same update that drops them: no extra write and no
// extra istiod push, and the survivors carry the load within the mirror's latency instead of up
// to a cycle and its settle rules later. It runs the planner (engine, rules for endpoints
// without metrics, bounds) on the last cycle's observations of the survivors, with the weights
// that were in force over that window and the Service's recent peak rate, which still holds the
// departed endpoints' traffic: the whole load is planned over fewer pods. The window-settle rules
// do not apply (weights.Input.Replan); the dead band does.
//
// It returns the weights by pod name and when they were planned, or nil to keep the weights the
// mirror would write anyway:
// in DryRun and Frozen; when the spec changed since the last cycle; for the published operator's algorithm, which reacts in its cycle only;
// when no endpoint left, or one joined (a rolling restart's replacement, a scale-up: the lost
// capacity is being replaced, and the newcomer has no observation to plan with), or a survivor's
// address was not listed, for the same pod, all along since the last cycle; when the last
// cycle's metrics failed (the hold and fallback rules keep deciding) or its observations are
// older than one metrics window; when the planner rejects the input; and when the re-plan changes
// nothing beyond the dead band.
func (m *Membership) replanWeights(alb *adlbv1.AdaptiveLoadBalancer, existing *networkingv1.ServiceEntry, built []istio.Endpoint) (map[string]uint32, time.Time) {
	if m == nil || existing == nil || alb.Spec.Mode == adlbv1.ModeDryRun || alb.Spec.Mode == adlbv1.ModeFrozen {
		return nil, time.Time{}
	}
	// Most mirror writes lose no endpoint: as many or more (Build lists each address once) means
	// none left without another joining, so nothing below, settings, plan or membership, is read.
	if len(built) >= len(existing.Spec.Endpoints) {
		return nil, time.Time{}
	}
	settings, err := EngineSettings(alb)
	if err != nil || (settings.Algorithm != weights.AlgorithmCapacity && settings.Algorithm != weights.AlgorithmTail) {
		return nil, time.Time{}
	}
	key := types.NamespacedName{Namespace: alb.Namespace, Name: alb.Name}
	m.mu.Lock()
	now := m.clock.Now()
	m.mu.Unlock()
	m.plans.mu.Lock()
	plan, ok := m.plans.byKey[key]
	m.plans.mu.Unlock()
	if !ok || plan.uid != alb.UID || plan.generation != alb.Generation || plan.at.IsZero() || now.Sub(plan.at) > plan.window {
		return nil, time.Time{}
	}
	before := map[string]bool{}
	for _, e := range existing.Spec.Endpoints {
		before[e.Address] = true
	}
	stay := map[string]string{} // pod by IP
	for _, e := range built {
		if !before[e.IP] {
			return nil, time.Time{}
		}
		stay[e.IP] = e.Pod
	}
	if len(stay) == len(before) || !m.listedThroughout(key, stay, plan.at) {
		return nil, time.Time{}
	}
	t := plan.target
	t.Replan, t.DryRun, t.WindowCoverage = true, false, 1
	// A re-plan answers a change of membership, not of load. The survivors' window rates lack
	// the departed pods' share, so the Service's projected rate would read as a rise of the load
	// and take the feedback's whole step at once. The recent peak still plans for the whole
	// Service's rate; the next cycle projects again, on the new membership.
	t.ProjectedRequestRate = 0
	t.Settings = settings
	t.Endpoints = slices.DeleteFunc(slices.Clone(t.Endpoints), func(e weights.Endpoint) bool { return stay[e.ID] == "" })
	if len(t.Endpoints) != len(stay) {
		return nil, time.Time{} // a survivor the last cycle did not observe
	}
	outcomes, _ := cycle.Plan(now, []cycle.Target{t}, map[string]cycle.State{t.Key: {LastGoodMetrics: plan.at, ModelDistrust: plan.distrust}}, 0)
	// Only a change is written: an unchanged decision carries the basis, the weights of the last
	// cycle's window, and writing those would undo that cycle's own write.
	o := outcomes[0]
	if o.Err != nil || o.Action != cycle.ActionWrite {
		return nil, time.Time{}
	}
	out := make(map[string]uint32, len(o.Decision.Endpoints))
	for _, r := range o.Decision.Endpoints {
		out[stay[r.ID]] = uint32(r.Weight)
	}
	return out, now
}
