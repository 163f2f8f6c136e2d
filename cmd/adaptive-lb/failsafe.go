package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
	"github.com/adaptive-lb/adaptive-lb/internal/controller"
)

var (
	serviceEntryGVK     = schema.GroupVersionKind{Group: "networking.istio.io", Version: "v1", Kind: "ServiceEntry"}
	serviceEntryListGVK = serviceEntryGVK.GroupVersion().WithKind("ServiceEntryList")
)

// failsafeOptions are the watchdog's flags.
type failsafeOptions struct {
	kubeconfig       string
	leaseNamespace   string
	leaseName        string
	staleAfter       time.Duration
	checkInterval    time.Duration
	namespaces       []string
	logLevel         string
	uninstall        bool
	uninstallTimeout time.Duration
}

func newFailsafeCmd() *cobra.Command {
	o := &failsafeOptions{}
	cmd := &cobra.Command{
		Use:   "failsafe",
		Short: "Watchdog: delete the operator's ServiceEntries when no operator replica renews its heartbeat",
		Long: `failsafe runs beside the operator, sharing nothing with it but the API server. The operator's
leader renews a heartbeat Lease (<leader-election-id>-heartbeat) every 10 s while its informers follow
the cluster. When the heartbeat has not been renewed for --stale-after (every replica down,
crash-looping or locked out, or the leader alive but blind: a verb removed from its Role, a wedged
watch, its CRD deleted), it deletes the ServiceEntries labelled app.kubernetes.io/managed-by=adaptive-lb of its
own installation (labelled adaptivelb.io/install=<lease namespace>.<lease name>, or without that
label: written by an older operator), so the mesh falls back to the Kubernetes endpoints instead of
keeping endpoints that go stale. Another installation's are never touched. When the operator sees
the cluster again it re-creates them. On each deleted ServiceEntry's AdaptiveLoadBalancer it sets
EndpointsMirrored=False (OperatorUnavailable), so that no status claims Ready for a Service the
operator no longer serves. At every check, whether or not an operator leads, it also deletes those
whose Service is gone: a ServiceEntry must never outlive its Service. For that it watches the
metadata of the Services and of the managed ServiceEntries in its namespaces, instead of listing
them at every check (about 1 KiB of memory per Service), and confirms a Service gone with one GET
before deleting. It needs to get the two Leases, to get, list and watch Services, to list, watch
and delete ServiceEntries, and to get AdaptiveLoadBalancers and patch their status, nothing else.

With --uninstall (the chart's post-delete hook) it waits until no operator holds the lease, deletes
the managed ServiceEntries and exits.`,
		Args: cobra.NoArgs,
		PreRunE: func(*cobra.Command, []string) error {
			return o.validate()
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if ctx == nil || ctx == context.Background() {
				ctx = ctrl.SetupSignalHandler()
			}
			return o.run(ctx, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty uses the in-cluster config or $KUBECONFIG")
	f.StringVar(&o.leaseNamespace, "leader-election-namespace", "", "namespace of the operator's leader Lease (default: the pod's own)")
	f.StringVar(&o.leaseName, "leader-election-id", "adaptive-lb.adaptivelb.io", "name of the operator's leader Lease; its heartbeat Lease is this name with -heartbeat")
	f.DurationVar(&o.staleAfter, "stale-after", 3*time.Minute, "how long the operator's heartbeat may go unrenewed before the managed ServiceEntries are deleted; keep it well above the operator's --leader-elect-lease-duration, which a normal failover can take")
	f.DurationVar(&o.checkInterval, "check-interval", 15*time.Second, "how often the heartbeat is read")
	f.StringSliceVar(&o.namespaces, "namespaces", nil, "namespaces whose Services and managed ServiceEntries it watches, and whose managed ServiceEntries it deletes (default: all); the operator's --watch-namespaces")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info or error")
	f.BoolVar(&o.uninstall, "uninstall", false, "wait until no operator holds the lease, delete the managed ServiceEntries and exit (the chart's post-delete hook)")
	f.DurationVar(&o.uninstallTimeout, "uninstall-timeout", 2*time.Minute, "with --uninstall: how long to wait for the operator to let go of the lease before deleting anyway")
	return cmd
}

func (o *failsafeOptions) validate() error {
	if o.staleAfter <= 0 || o.checkInterval <= 0 {
		return newUsageError("--stale-after and --check-interval must be positive")
	}
	if o.checkInterval > o.staleAfter {
		return newUsageError("--check-interval %v must not exceed --stale-after %v: a stale lease would go unnoticed for a whole interval", o.checkInterval, o.staleAfter)
	}
	if o.uninstallTimeout <= 0 {
		return newUsageError("--uninstall-timeout must be positive")
	}
	return checkLogLevel(o.logLevel)
}

func (o *failsafeOptions) run(ctx context.Context, logTo io.Writer) error {
	// Its own logger, not controller-runtime's global one: the watchdog shares nothing with
	// an operator, also when both run in one test process.
	logger := newJSONLogger(logTo, logLevels[o.logLevel]).WithName("failsafe")
	cfg, err := restConfigFrom(o.kubeconfig, "adaptive-lb-failsafe/"+version)
	if err != nil {
		return err
	}
	namespace, err := leaseNamespace(o.leaseNamespace)
	if err != nil {
		return newUsageError("%v", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	// The status of the AdaptiveLoadBalancers whose ServiceEntries it deletes.
	if err := adlbv1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("build the Kubernetes client: %w", err)
	}
	w := &watchdog{
		client: c, clock: clock.RealClock{}, logger: logger,
		lease:      types.NamespacedName{Namespace: namespace, Name: o.leaseName},
		heartbeat:  types.NamespacedName{Namespace: namespace, Name: controller.HeartbeatLeaseName(o.leaseName)},
		staleAfter: o.staleAfter, namespaces: o.namespaces,
	}
	if o.uninstall {
		// It deletes everything it lists, once: no watch.
		return w.uninstall(ctx, o.checkInterval, o.uninstallTimeout)
	}
	w.watched = newWatchedMetadata(cfg, o.namespaces, logger)
	w.watched.start(ctx)
	if !w.watched.waitForSync(ctx, watchSyncWait) && ctx.Err() != nil {
		return nil
	}
	logger.Info("watching the operator's heartbeat", "heartbeat", w.heartbeat, "staleAfter", o.staleAfter, "checkInterval", o.checkInterval)
	ticker := time.NewTicker(o.checkInterval)
	defer ticker.Stop()
	for {
		w.check(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// watchdog decides from the operator's heartbeat Lease whether a leader is alive and sees the
// cluster, and deletes the managed ServiceEntries when none has for staleAfter. The leader Lease
// names the installation (installSelectors) and, at uninstall, says when the operator is gone.
type watchdog struct {
	client     client.Client
	clock      clock.PassiveClock
	logger     logr.Logger
	lease      types.NamespacedName
	heartbeat  types.NamespacedName
	staleAfter time.Duration
	namespaces []string
	// watched follows the Services and the managed ServiceEntries, for deleteWithoutService.
	watched *watchedMetadata

	seen       bool
	confirmed  bool      // the record has been read unchanged at least twice
	lastRecord string    // holder and renew time as last read ("" for no Lease)
	lastChange time.Time // when lastRecord last changed, by this process's clock
	fellBack   bool
}

// heartbeatRecord reads the heartbeat Lease: its holder and renew time, "" when it does not exist.
func (w *watchdog) heartbeatRecord(ctx context.Context) (record string, renewed time.Time, err error) {
	lease := &coordinationv1.Lease{}
	if err := w.client.Get(ctx, w.heartbeat, lease); apierrors.IsNotFound(err) {
		return "", time.Time{}, nil
	} else if err != nil {
		return "", time.Time{}, fmt.Errorf("read the operator's heartbeat Lease %s: %w", w.heartbeat, err)
	}
	if lease.Spec.RenewTime != nil {
		renewed = lease.Spec.RenewTime.Time
	}
	return ptr.Deref(lease.Spec.HolderIdentity, "") + "@" + renewed.UTC().Format(time.RFC3339Nano), renewed, nil
}

// check reads the heartbeat once and deletes the managed ServiceEntries if it is stale. Staleness is
// measured by this process's clock, from when it saw the record change: clock skew between the
// operator's node and this one does not matter. Only at the first reading, a renew time already
// older than staleAfter counts (the watchdog restarted while the operator was down), and only
// once a second reading finds the record unchanged: the renew time is the operator's clock, and
// an operator whose node runs minutes behind would look stale at the first reading.
func (w *watchdog) check(ctx context.Context) {
	// Until the watches have synced, a Service missing from them may only not be delivered yet.
	if w.watched.isSynced() {
		if _, err := w.deleteWithoutService(ctx); err != nil {
			w.logger.Error(err, "deleting the ServiceEntries whose Service is gone failed; retrying at the next check")
		}
	} else {
		w.logger.V(1).Info("the watches of the Services and the managed ServiceEntries have not synced: not looking for ServiceEntries whose Service is gone")
	}
	now := w.clock.Now()
	record, renewed, err := w.heartbeatRecord(ctx)
	if err != nil {
		// The API server is unreachable or refuses: no ServiceEntry can change either.
		w.logger.Error(err, "cannot check the operator's heartbeat; retrying")
		return
	}
	if !w.seen || record != w.lastRecord {
		w.lastChange = now
		if !w.seen && !renewed.IsZero() && renewed.Before(now) {
			w.lastChange = renewed
		}
		w.seen, w.lastRecord, w.confirmed = true, record, false
	} else {
		w.confirmed = true
	}
	idle := now.Sub(w.lastChange)
	if idle < w.staleAfter || !w.confirmed {
		if w.fellBack {
			w.logger.Info("the operator renews its heartbeat again; it re-creates the ServiceEntries", "heartbeat", w.heartbeat, "record", record)
			w.fellBack = false
		}
		w.logger.V(1).Info("heartbeat fresh", "record", record, "unchangedFor", idle.Round(time.Millisecond))
		return
	}
	why := fmt.Sprintf("no adaptive-lb operator has renewed its heartbeat Lease %s for %s (every replica down, or the leader blind to the cluster): the fail-open watchdog deleted the ServiceEntry, so that clients use the Kubernetes endpoints, unweighted; the operator re-creates it when it follows the cluster again",
		w.heartbeat, idle.Round(time.Second))
	n, err := w.deleteManaged(ctx, why)
	if err != nil {
		w.logger.Error(err, "deleting the managed ServiceEntries failed; retrying at the next check")
	}
	if n > 0 || !w.fellBack {
		w.logger.Info("no operator has renewed its heartbeat (down, or alive but no longer seeing the cluster): deleted the managed ServiceEntries, the mesh uses the Kubernetes endpoints",
			"heartbeat", w.heartbeat, "unrenewedFor", idle.Round(time.Second), "deleted", n)
	}
	w.fellBack = true
}

// installSelectors select the ServiceEntries of installation installID: the managed ones labelled
// with it, and the managed ones without an installation label, which an operator older than that
// label wrote. Those may be another installation's still on an old version; deleting one of them
// is safe (the mesh falls back to the Kubernetes endpoints and its live operator re-creates it at
// once), keeping a dead installation's forever is not. An upgraded operator stamps its label on
// each of its ServiceEntries with that one's next write (not all at once at the upgrade), and on
// every one it re-creates.
func installSelectors(installID string) []labels.Selector {
	managed, _ := labels.NewRequirement(controller.ManagedByLabel, selection.Equals, []string{controller.ManagedByValue})
	mine, _ := labels.NewRequirement(controller.InstallLabel, selection.Equals, []string{installID})
	legacy, _ := labels.NewRequirement(controller.InstallLabel, selection.DoesNotExist, nil)
	return []labels.Selector{labels.NewSelector().Add(*managed, *mine), labels.NewSelector().Add(*managed, *legacy)}
}

// deleteManaged deletes the ServiceEntries of this watchdog's installation, in the watched
// namespaces, and says why on the status of each one's AdaptiveLoadBalancer.
func (w *watchdog) deleteManaged(ctx context.Context, why string) (int, error) {
	return deleteInstallationServiceEntries(ctx, w.client, controller.InstallID(w.lease.Namespace, w.lease.Name), w.namespaces, func(se *metav1.PartialObjectMetadata) {
		// After the deletion, which matters most: a status the watchdog may not write (an RBAC
		// older than this rule) is logged, never a reason to keep the ServiceEntry.
		if err := controller.MarkServiceEntryRemoved(ctx, w.client, se, adlbv1.ReasonOperatorUnavailable, why); err != nil {
			w.logger.Error(err, "cannot say on its AdaptiveLoadBalancer that the ServiceEntry is deleted", "serviceEntry", client.ObjectKeyFromObject(se))
		}
	})
}

// deleteInstallationServiceEntries deletes the ServiceEntries of installation installID
// (installSelectors) in namespaces (all when empty), calling after (when not nil) on each
// one deleted.
func deleteInstallationServiceEntries(ctx context.Context, c client.Client, installID string, namespaces []string, after func(*metav1.PartialObjectMetadata)) (int, error) {
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	deleted := 0
	var errs []error
	for _, ns := range namespaces {
		for _, sel := range installSelectors(installID) {
			n, err := deleteSelected(ctx, c, ns, sel, after)
			deleted += n
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return deleted, errors.Join(errs...)
}

// deleteSelected deletes the ServiceEntries sel selects in ns.
func deleteSelected(ctx context.Context, c client.Client, ns string, sel labels.Selector, after func(*metav1.PartialObjectMetadata)) (int, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(serviceEntryListGVK)
	if err := c.List(ctx, list, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return 0, fmt.Errorf("list ServiceEntries %s in %q: %w", sel, ns, err)
	}
	deleted := 0
	var errs []error
	for i := range list.Items {
		se := &list.Items[i]
		se.SetGroupVersionKind(serviceEntryGVK)
		if err := c.Delete(ctx, se, client.Preconditions{UID: ptr.To(se.UID)}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("delete ServiceEntry %s/%s: %w", se.Namespace, se.Name, err))
			continue
		}
		deleted++
		if after != nil {
			after(se)
		}
	}
	return deleted, errors.Join(errs...)
}

// uninstall waits until the lease is released or has not been renewed for a lease duration (the
// operator's pods are gone), then deletes the managed ServiceEntries. Deleting before that would
// race an operator that re-creates them.
func (w *watchdog) uninstall(ctx context.Context, interval, timeout time.Duration) error {
	deadline := w.clock.Now().Add(timeout)
	for {
		free, err := w.leaseFree(ctx)
		if err != nil {
			w.logger.Error(err, "cannot read the operator's lease; retrying")
		}
		if free || !w.clock.Now().Before(deadline) {
			if !free {
				w.logger.Info("the operator still holds its lease after the timeout; deleting the ServiceEntries anyway", "timeout", timeout)
			}
			n, err := w.deleteManaged(ctx, "adaptive-lb was uninstalled: its ServiceEntry was deleted, so that clients use the Kubernetes endpoints, unweighted; delete this AdaptiveLoadBalancer, or install adaptive-lb again")
			if err != nil {
				return err
			}
			w.logger.Info("deleted the managed ServiceEntries", "deleted", n)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// leaseFree reports whether no operator holds the lease: none exists, it was released, or it
// expired by its own duration.
func (w *watchdog) leaseFree(ctx context.Context) (bool, error) {
	lease := &coordinationv1.Lease{}
	if err := w.client.Get(ctx, w.lease, lease); apierrors.IsNotFound(err) {
		return true, nil
	} else if err != nil {
		return false, err
	}
	if ptr.Deref(lease.Spec.HolderIdentity, "") == "" || lease.Spec.RenewTime == nil {
		return true, nil
	}
	duration := time.Duration(ptr.Deref(lease.Spec.LeaseDurationSeconds, 15)) * time.Second
	return w.clock.Since(lease.Spec.RenewTime.Time) > 2*duration, nil
}
