package controller

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/adaptive-lb/adaptive-lb/internal/progress"
)

// HeartbeatLeaseName is the Lease in which the leader of the installation whose leader Lease is
// leaderLeaseName shows that it still sees the cluster.
func HeartbeatLeaseName(leaderLeaseName string) string {
	return leaderLeaseName + "-heartbeat"
}

// DefaultHeartbeatInterval is how often the leader renews its heartbeat while it sees the
// cluster: one small Lease update every 10 s.
const DefaultHeartbeatInterval = 10 * time.Second

// Heartbeat renews a Lease (its renewTime) while every informer the mirror reads makes progress.
// The fail-open watchdog reads it instead of the leader Lease: a leader renews its leader Lease as
// long as it reaches the API server, also while its informers are frozen (a verb removed from its
// Role, a wedged watch, its CRD deleted), and then only its heartbeat says that it has stopped
// seeing the cluster. It runs on the leader only.
type Heartbeat struct {
	// Client writes the Lease; Reader reads it uncached (a cached read would start an informer
	// on Leases).
	Client   client.Client
	Reader   client.Reader
	Lease    types.NamespacedName
	Identity string
	Interval time.Duration
	Progress *progress.Tracker
	Clock    clock.PassiveClock
	Logger   logr.Logger
}

var _ manager.LeaderElectionRunnable = &Heartbeat{}

// NeedLeaderElection: only the leader writes, so only it has a heartbeat to give.
func (h *Heartbeat) NeedLeaderElection() bool { return true }

// Start beats every Interval until ctx ends.
func (h *Heartbeat) Start(ctx context.Context) error {
	if h.Clock == nil {
		h.Clock = clock.RealClock{}
	}
	if h.Interval <= 0 {
		h.Interval = DefaultHeartbeatInterval
	}
	ticker := time.NewTicker(h.Interval)
	defer ticker.Stop()
	skipping := false
	for {
		if blind := blindMirrorInformers(h.Progress); len(blind) > 0 {
			if !skipping {
				h.Logger.Error(nil, "heartbeat withheld: an informer has stopped following the cluster; the fail-open watchdog deletes the ServiceEntries if this lasts",
					"heartbeat", h.Lease, "informers", describeBlindness(blind))
			}
			skipping = true
		} else {
			if skipping {
				h.Logger.Info("heartbeat resumed: every informer follows the cluster again", "heartbeat", h.Lease)
			}
			skipping = false
			if err := h.beat(ctx); err != nil && ctx.Err() == nil {
				h.Logger.Error(err, "cannot renew the heartbeat; retrying", "heartbeat", h.Lease)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// beat writes the Lease's holder and renew time, creating it the first time.
func (h *Heartbeat) beat(ctx context.Context) error {
	now := metav1.NewMicroTime(h.Clock.Now())
	lease := &coordinationv1.Lease{}
	err := h.Reader.Get(ctx, h.Lease, lease)
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: h.Lease.Name, Namespace: h.Lease.Namespace},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(h.Identity),
				RenewTime:            &now,
				LeaseDurationSeconds: ptr.To(int32(max(1, math.Ceil((3 * h.Interval).Seconds())))),
			},
		}
		if err := h.Client.Create(ctx, lease); err != nil {
			return fmt.Errorf("create the heartbeat Lease %s: %w", h.Lease, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the heartbeat Lease %s: %w", h.Lease, err)
	}
	lease.Spec.HolderIdentity = ptr.To(h.Identity)
	lease.Spec.RenewTime = &now
	if err := h.Client.Update(ctx, lease); err != nil {
		return fmt.Errorf("renew the heartbeat Lease %s: %w", h.Lease, err)
	}
	return nil
}

func describeBlindness(blind []progress.Blindness) string {
	parts := make([]string, len(blind))
	for i, b := range blind {
		parts[i] = b.String()
	}
	return strings.Join(parts, "; ")
}
