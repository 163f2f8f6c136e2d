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
		Short: "Watchdog: delete the operator's ServiceEntries when no operator replica renews the leader lease",
		Long: `failsafe runs beside the operator, sharing nothing with it but the API server. When the
operator's leader Lease has not been renewed for --stale-after (every replica down, crash-looping or
locked out), it deletes the ServiceEntries labelled app.kubernetes.io/managed-by=adaptive-lb of its
own installation (labelled adaptivelb.io/install=<lease namespace>.<lease name>, or without that
label: written by an older operator), so the mesh falls back to the Kubernetes endpoints instead of
keeping endpoints that go stale. Another installation's are never touched. When the operator leads
again it re-creates them. At every check, whether or not an operator leads, it also deletes those
whose Service is gone: a ServiceEntry must never outlive its Service. It needs to read the Lease,
to list Services and to list and delete ServiceEntries, nothing else.

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
	f.StringVar(&o.leaseName, "leader-election-id", "adaptive-lb.adaptivelb.io", "name of the operator's leader Lease")
	f.DurationVar(&o.staleAfter, "stale-after", 3*time.Minute, "how long the lease may go unrenewed before the managed ServiceEntries are deleted; keep it well above the operator's --leader-elect-lease-duration, which a normal failover can take")
	f.DurationVar(&o.checkInterval, "check-interval", 15*time.Second, "how often the lease is read")
	f.StringSliceVar(&o.namespaces, "namespaces", nil, "namespaces whose managed ServiceEntries are deleted (default: all); the operator's --watch-namespaces")
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
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("build the Kubernetes client: %w", err)
	}
	w := &watchdog{
		client: c, clock: clock.RealClock{}, logger: logger,
		lease:      types.NamespacedName{Namespace: namespace, Name: o.leaseName},
		staleAfter: o.staleAfter, namespaces: o.namespaces,
	}
	if o.uninstall {
		return w.uninstall(ctx, o.checkInterval, o.uninstallTimeout)
	}
	logger.Info("watching the operator's leader lease", "lease", w.lease, "staleAfter", o.staleAfter, "checkInterval", o.checkInterval)
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

// watchdog decides from the leader Lease whether any operator replica is alive, and deletes the
// managed ServiceEntries when none has been for staleAfter.
type watchdog struct {
	client     client.Client
	clock      clock.PassiveClock
	logger     logr.Logger
	lease      types.NamespacedName
	staleAfter time.Duration
	namespaces []string

	seen       bool
	confirmed  bool      // the record has been read unchanged at least twice
	lastRecord string    // holder and renew time as last read ("" for no Lease)
	lastChange time.Time // when lastRecord last changed, by this process's clock
	fellBack   bool
}

// leaseRecord reads the Lease: its holder and renew time, "" when it does not exist.
func (w *watchdog) leaseRecord(ctx context.Context) (record string, renewed time.Time, err error) {
	lease := &coordinationv1.Lease{}
	if err := w.client.Get(ctx, w.lease, lease); apierrors.IsNotFound(err) {
		return "", time.Time{}, nil
	} else if err != nil {
		return "", time.Time{}, fmt.Errorf("read the leader Lease %s: %w", w.lease, err)
	}
	if lease.Spec.RenewTime != nil {
		renewed = lease.Spec.RenewTime.Time
	}
	return ptr.Deref(lease.Spec.HolderIdentity, "") + "@" + renewed.UTC().Format(time.RFC3339Nano), renewed, nil
}

// check reads the Lease once and deletes the managed ServiceEntries if it is stale. Staleness is
// measured by this process's clock, from when it saw the record change: clock skew between the
// operator's node and this one does not matter. Only at the first reading, a renew time already
// older than staleAfter counts (the watchdog restarted while the operator was down), and only
// once a second reading finds the record unchanged: the renew time is the operator's clock, and
// an operator whose node runs minutes behind would look stale at the first reading.
func (w *watchdog) check(ctx context.Context) {
	if _, err := w.deleteWithoutService(ctx); err != nil {
		w.logger.Error(err, "deleting the ServiceEntries whose Service is gone failed; retrying at the next check")
	}
	now := w.clock.Now()
	record, renewed, err := w.leaseRecord(ctx)
	if err != nil {
		// The API server is unreachable or refuses: no ServiceEntry can change either.
		w.logger.Error(err, "cannot check the operator's lease; retrying")
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
			w.logger.Info("the operator renews its lease again; it re-creates the ServiceEntries", "lease", w.lease, "record", record)
			w.fellBack = false
		}
		w.logger.V(1).Info("leader lease fresh", "record", record, "unchangedFor", idle.Round(time.Millisecond))
		return
	}
	n, err := w.deleteManaged(ctx)
	if err != nil {
		w.logger.Error(err, "deleting the managed ServiceEntries failed; retrying at the next check")
	}
	if n > 0 || !w.fellBack {
		w.logger.Info("no operator has renewed the leader lease: deleted the managed ServiceEntries, the mesh uses the Kubernetes endpoints",
			"lease", w.lease, "unrenewedFor", idle.Round(time.Second), "deleted", n)
	}
	w.fellBack = true
}

// installSelectors select the ServiceEntries this watchdog deletes: the managed ones labelled
// with its installation (its Lease), and the managed ones without an installation label, which
// an operator older than that label wrote. Those may be another installation's still on an old
// version; deleting one of them is safe (the mesh falls back to the Kubernetes endpoints and its
// live operator re-creates it at once), keeping a dead installation's forever is not. An upgraded
// operator stamps its label on each of its ServiceEntries with that one's next write (not all at
// once at the upgrade), and on every one it re-creates.
func (w *watchdog) installSelectors() []labels.Selector {
	managed, _ := labels.NewRequirement(controller.ManagedByLabel, selection.Equals, []string{controller.ManagedByValue})
	mine, _ := labels.NewRequirement(controller.InstallLabel, selection.Equals, []string{controller.InstallID(w.lease.Namespace, w.lease.Name)})
	legacy, _ := labels.NewRequirement(controller.InstallLabel, selection.DoesNotExist, nil)
	return []labels.Selector{labels.NewSelector().Add(*managed, *mine), labels.NewSelector().Add(*managed, *legacy)}
}

// deleteManaged deletes the ServiceEntries of this installation (installSelectors), in the
// watched namespaces.
func (w *watchdog) deleteManaged(ctx context.Context) (int, error) {
	namespaces := w.namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	deleted := 0
	var errs []error
	for _, ns := range namespaces {
		for _, sel := range w.installSelectors() {
			n, err := w.deleteSelected(ctx, ns, sel)
			deleted += n
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return deleted, errors.Join(errs...)
}

// deleteSelected deletes the ServiceEntries sel selects in ns.
func (w *watchdog) deleteSelected(ctx context.Context, ns string, sel labels.Selector) (int, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(serviceEntryListGVK)
	if err := w.client.List(ctx, list, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return 0, fmt.Errorf("list ServiceEntries %s in %q: %w", sel, ns, err)
	}
	deleted := 0
	var errs []error
	for i := range list.Items {
		se := &list.Items[i]
		se.SetGroupVersionKind(serviceEntryGVK)
		if err := w.client.Delete(ctx, se, client.Preconditions{UID: ptr.To(se.UID)}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("delete ServiceEntry %s/%s: %w", se.Namespace, se.Name, err))
			continue
		}
		deleted++
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
			n, err := w.deleteManaged(ctx)
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
