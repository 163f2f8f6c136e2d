package controller

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/metrics"
	"github.com/adaptive-lb/adaptive-lb/internal/weights"
)

// The tail algorithm's surge bound keeps every split able to carry a sudden rise of the load until
// the next cycle has measured it. One default for every Service makes the steady ones pay for the
// surges of others; each tail Service's bound is learned from its own load history instead
// (loadhistory.go, weights.SurgeBound), unless its spec sets one. Status says which is in force
// and why.

// surgeInForce is the surge bound a tail cycle plans with, and why.
type surgeInForce struct {
	// tail is false for the other algorithms: no bound, and no status.surgeBound.
	tail bool
	// factor is the bound in force; input is what the engine is given for it
	// (weights.Input.SurgeFactor): 0 for the settings' own, the spec's or the default.
	factor, input float64
	reason        string
	// history is the Service's load history (zero: unknown), learned at learnedAt.
	history   weights.LoadHistory
	learnedAt time.Time
	// planWithHistory says the engine is given the history (weights.Input.LoadHistory), which
	// also sets the margin over the recent peak: not when the spec sets the surge factor or the
	// burst margin, which the user's numbers decide.
	planWithHistory bool
}

// engineHistory is the load history the engine plans with: none when the spec decides.
func (s surgeInForce) engineHistory() weights.LoadHistory {
	if !s.planWithHistory {
		return weights.LoadHistory{}
	}
	return s.history
}

// ReasonSurgeFromSpec is status.surgeBound's reason when spec.tail.surgeFactor sets the bound.
const ReasonSurgeFromSpec = "set in spec.tail.surgeFactor"

// surgeBoundFor decides d's surge bound for a cycle at now: the spec's, else the one its load
// history needs, else the default, saying why; it queues a read of the history when one is due.
// A history that cannot be read never holds the cycle: the bound learned last stays, or the
// default until one is learned. The weight cycle holds w.mu.
func (w *WeightCycle) surgeBoundFor(d *dueTarget, now time.Time) surgeInForce {
	if d.settings.Algorithm != weights.AlgorithmTail {
		return surgeInForce{}
	}
	var st historyState
	if w.History.On() {
		st = w.History.State(d.alb, d.interval, now)
	}
	def := d.settings.Tail.SurgeFactor
	s := surgeInForce{tail: true, factor: def, history: st.history, learnedAt: st.learnedAt}
	switch {
	case d.alb.Spec.Tail != nil && d.alb.Spec.Tail.SurgeFactor != nil:
		// EngineSettings has put it in the settings already.
		s.reason = ReasonSurgeFromSpec
	case !w.History.On():
		s.reason = fmt.Sprintf("load history not read (--load-history=0): the default surge bound %s", formatFactor(def))
	case st.learnedAt.IsZero() && st.err != nil:
		s.reason = fmt.Sprintf("load history unreadable (%s): the default surge bound %s until a read succeeds", historyFailure(st.err), formatFactor(def))
	case st.learnedAt.IsZero():
		s.reason = fmt.Sprintf("load history not read yet: the default surge bound %s", formatFactor(def))
	default:
		s.factor, s.reason = weights.SurgeBound(d.settings.Tail, st.history)
		s.input = s.factor
		switch {
		case !st.history.Known():
			// The engine plans with the settings' margin; nothing to say beyond the bound.
		case d.alb.Spec.Tail != nil && d.alb.Spec.Tail.BurstMargin != nil:
			s.reason += fmt.Sprintf("; planning margin %s over the recent peak, set in spec.tail.burstMargin", formatFactor(d.settings.Tail.BurstMargin))
		default:
			s.planWithHistory = true
			s.reason += fmt.Sprintf("; planning margin %s over the recent peak", formatFactor(weights.PlanningMargin(d.settings.Tail, st.history)))
		}
		if st.err != nil {
			s.reason += fmt.Sprintf("; the last read of the history since failed (%s): this bound stays until a read succeeds", historyFailure(st.err))
		}
	}
	return s
}

// historyFailure says in a few words why a history read failed: the TSDB's answer, without the
// query text, which the log has.
func historyFailure(err error) string {
	var qe *metrics.QueryError
	if errors.As(err, &qe) {
		err = qe.Err
	}
	return shorten(err.Error(), 300)
}

// formatFactor spells a factor as the engine's reasons do.
func formatFactor(f float64) string { return fmt.Sprintf("%.3g×", f) }

// surgeBoundStatus is status.surgeBound for s: nil for the other algorithms, or when a number
// does not fit the schema's Decimal (a rise of 10^13 and more, which only a wrong query gives):
// the API server would refuse the whole status write, conditions and all.
func surgeBoundStatus(s surgeInForce) *adlbv1.SurgeBound {
	if !s.tail || !(s.factor >= 0) {
		return nil
	}
	factor := strconv.FormatFloat(s.factor, 'f', 2, 64)
	if len(factor) > maxDecimalLength {
		return nil
	}
	sb := &adlbv1.SurgeBound{Factor: adlbv1.Decimal(factor), Reason: shorten(s.reason, 1000)}
	if s.history.Known() {
		if rise := strconv.FormatFloat(s.history.MaxRise, 'f', 2, 64); len(rise) <= maxDecimalLength {
			d := adlbv1.Decimal(rise)
			sb.MaxRise = &d
		}
		seconds := int64(s.history.Seconds)
		sb.HistorySeconds = &seconds
	}
	if !s.learnedAt.IsZero() {
		t := metav1.NewTime(s.learnedAt)
		sb.LearnedAt = &t
	}
	return sb
}
