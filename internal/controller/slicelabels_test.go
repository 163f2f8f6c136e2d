package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	adlbv1 "github.com/adaptive-lb/adaptive-lb/api/v1alpha1"
)

// stripLabel removes one label from a ServiceEntry slice, as a policy engine or a hand edit
// might.
func (f *fixture) stripLabel(slice, label string) {
	f.t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, label)
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: slice}}
	if err := k8s.Patch(f.ctx, se, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		f.t.Fatal(err)
	}
}

// A slice stripped of the labels the operator stamps on it (its owner, its Service) is rewritten
// with them: the stale removal and the watchdog find slices by those labels.
func TestMirror_RestoresTheLabelsItStampsOnEverySlice(t *testing.T) {
	f := newFixture(t)
	f.slicedService("labelled", 90, 61)
	f.stripLabel("labelled.1", ServiceEntryOwnerLabel)
	f.stripLabel("labelled.2", ServiceLabel)
	f.eventually("every slice carries its owner and Service labels again", func() error {
		for _, se := range f.serviceEntrySlices("labelled") {
			if se.Labels[ServiceEntryOwnerLabel] != "labelled" || se.Labels[ServiceLabel] != "labelled" || se.Labels[ManagedByLabel] != ManagedByValue {
				return fmt.Errorf("slice %s has labels %v", se.Name, se.Labels)
			}
		}
		return nil
	})
}

// A slice whose owner label was stripped while the mirror could not write (here: an admission
// policy refuses every ServiceEntry write that carries the label, so the operator can neither
// follow the endpoints nor put the label back) is found by the stale removal all the same, by
// its Service label: once the mirror has failed for the stale timeout no slice is left with
// endpoints that no longer follow the pods.
func TestMirror_AStaleSliceStrippedOfItsOwnerLabelIsDeletedToo(t *testing.T) {
	f := newFixture(t)
	eps, _, _ := f.slicedService("stripped", 90, 62)
	lift := f.admissionPolicyRefusing("refuse-owned-se-writes-"+f.ns, []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
		fmt.Sprintf("!(has(object.metadata.labels) && %q in object.metadata.labels)", ServiceEntryOwnerLabel), func() error {
			se, err := f.serviceEntry("stripped")
			if err != nil {
				return err
			}
			se.Annotations["probe"] = "x"
			if err := k8s.Update(f.ctx, se, client.DryRunAll); apierrors.IsInvalid(err) && strings.Contains(err.Error(), "test policy") {
				return nil
			} else {
				return fmt.Errorf("a dry-run update returned %v", err)
			}
		})
	defer lift()
	f.stripLabel("stripped.1", ServiceEntryOwnerLabel)
	// A pod leaves: the mirror cannot follow.
	f.slice("stripped", "stripped-x", eps[1:]...)
	f.waitForCondition("stripped", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonWriteFailed)

	deadline := time.Now().Add(suiteStaleTimeout + 2*time.Minute)
	for {
		left := f.serviceEntrySlices("stripped")
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slices %v still exist %v after the mirror began failing; want every one deleted after the stale timeout (%v)", sliceNames(left), suiteStaleTimeout+2*time.Minute, suiteStaleTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.waitForCondition("stripped", adlbv1.ConditionEndpointsMirrored, metav1.ConditionFalse, adlbv1.ReasonStaleServiceEntryRemoved)
}
