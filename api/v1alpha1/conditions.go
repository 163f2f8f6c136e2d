package v1alpha1

// Condition types.
const (
	// ConditionReady summarises the others: True when the endpoints are mirrored, the weights
	// are written (or, in DryRun and Frozen, deliberately not) and no metrics fault is reported.
	// Every status writer recomputes it from the other conditions it finds on the object.
	ConditionReady = "Ready"
	// ConditionEndpointsMirrored: the ServiceEntry lists exactly the Service's ready endpoints.
	// Written by the endpoint mirror (the reconciler) only.
	ConditionEndpointsMirrored = "EndpointsMirrored"
	// ConditionMetricsAvailable: the last metrics fetch for this Service succeeded. Written by the
	// weight cycle; the reconciler only adds an Unknown placeholder while the condition is absent.
	ConditionMetricsAvailable = "MetricsAvailable"
	// ConditionWeightsApplied: the ServiceEntry carries the weights the engine decided. Written
	// by the weight cycle; the reconciler only adds a placeholder while the condition is absent.
	ConditionWeightsApplied = "WeightsApplied"
	// ConditionWeightsEnforced: the Service's clients balance by the ServiceEntry's weights, as
	// far as the operator can tell from the Service, its namespace and its pods: clients with a
	// sidecar, gateways and waypoints do; ztunnel (ambient mode) does only through a waypoint
	// bound to the Service. Written by the endpoint mirror (the reconciler) only.
	ConditionWeightsEnforced = "WeightsEnforced"
)

// Condition reasons (CamelCase, stable: alerts and scripts match on them).
const (
	// ReasonMirrored: the ServiceEntry mirrors the Service's ready endpoints.
	ReasonMirrored = "Mirrored"
	// ReasonTargetNotFound: the target Service does not exist.
	ReasonTargetNotFound = "TargetNotFound"
	// ReasonUnsupported: the Service has no selector, is ExternalName or is headless.
	ReasonUnsupported = "Unsupported"
	// ReasonConflict: another AdaptiveLoadBalancer targets the same Service, or another owner's
	// ServiceEntry declares the Service's host for the same clients (istiod would list its
	// copies of the pods first, shadowing the weights); no ServiceEntry is written.
	ReasonConflict = "Conflict"
	// ReasonMultiCluster: the mesh spans several clusters (istiod's own count of its remote
	// clusters, mesh networks of several registries, the operator told so), or the operator
	// cannot tell (no count from the TSDB and not told single-cluster). istiod merges the other
	// clusters' pods of the Service beside the weighted ones at weight 1, so weights would move
	// traffic between clusters; no ServiceEntry is written.
	ReasonMultiCluster = "MultiCluster"
	// ReasonAmbientUnsupportedIstioVersion: the Service is in ambient mode and istiod is older
	// than 1.28.1 (1.29.0 on its line), or its version is unknown: it would give ztunnel a
	// second, plaintext workload for every pod of a ServiceEntry; no ServiceEntry is written.
	ReasonAmbientUnsupportedIstioVersion = "AmbientUnsupportedIstioVersion"
	// ReasonMeshConfigInvalid: istiod's mesh config (its ConfigMap) cannot be read, so the
	// Service's visibility is unknown; no ServiceEntry is written.
	ReasonMeshConfigInvalid = "MeshConfigInvalid"
	// ReasonEnforcedBySidecars (WeightsEnforced=True): no pod of the Service is in ambient mode;
	// its clients with a sidecar, gateways and waypoints balance by the weights.
	ReasonEnforcedBySidecars = "Sidecars"
	// ReasonEnforcedByWaypoint (WeightsEnforced=True): the Service's pods are in ambient mode
	// and istiod reports a waypoint bound to it; ztunnel clients reach it through the waypoint,
	// which balances by the weights.
	ReasonEnforcedByWaypoint = "Waypoint"
	// ReasonAmbientWithoutWaypoint (WeightsEnforced=False): pods of the Service are in ambient
	// mode and no waypoint is bound to it: ztunnel clients balance without the weights.
	ReasonAmbientWithoutWaypoint = "AmbientWithoutWaypoint"
	// ReasonServiceEntryNotOwned: a ServiceEntry with the operator's name exists and is not ours;
	// the operator never overwrites a user's object.
	ReasonServiceEntryNotOwned = "ServiceEntryNotOwned"
	// ReasonWriteFailed: the API server rejected or failed a ServiceEntry write; it is retried.
	ReasonWriteFailed = "WriteFailed"
	// ReasonCacheStale: an informer of the operator has stopped following the cluster (its
	// list or watch is refused or fails, or it has received nothing, not even the API server's
	// periodic bookmark); nothing is mirrored from the stale caches, and the ServiceEntry is
	// deleted once that has lasted --stale-serviceentry-timeout.
	ReasonCacheStale = "CacheStale"
	// ReasonNoPorts: none of the selected ports exist on the Service.
	ReasonNoPorts = "NoPorts"
	// ReasonTooManyEndpoints: the ServiceEntry would exceed etcd's object size limit; it is
	// deleted and the Service's clients use the Kubernetes endpoints, unweighted.
	ReasonTooManyEndpoints = "TooManyEndpoints"
	// ReasonStaleServiceEntryRemoved: mirroring the Service has failed for longer than the
	// operator's --stale-serviceentry-timeout; the ServiceEntry, which no longer follows the
	// endpoints, is deleted until a mirror succeeds again.
	ReasonStaleServiceEntryRemoved = "StaleServiceEntryRemoved"
	// ReasonEqualWeights: weights are equal; no weight cycle has run yet.
	ReasonEqualWeights = "EqualWeights"
	// ReasonWeightsApplied: the decided weights are in the ServiceEntry.
	ReasonWeightsApplied = "Applied"
	// ReasonDryRun: weights are computed but not written (mode DryRun).
	ReasonDryRun = "DryRun"
	// ReasonAwaitingMetrics: no metrics fetch has happened yet.
	ReasonAwaitingMetrics = "AwaitingMetrics"
	// ReasonMetricsFailed: the metrics source failed; weights are held, then reset to equal.
	ReasonMetricsFailed = "MetricsFailed"
	// ReasonMetricsOK: the last metrics fetch succeeded.
	ReasonMetricsOK = "MetricsOK"
	// ReasonFallback: metrics have been unavailable longer than the hold time; weights are equal.
	ReasonFallback = "FallbackToEqualWeights"
	// ReasonDeferred: a weight write waits for the cluster-wide write budget.
	ReasonDeferred = "Deferred"
	// ReasonModelOverruled: the tail algorithm's measurements overruled its latency model (a
	// group the weights loaded to its CPU limit, or a tail the model cannot explain); the
	// weights written move toward the capacity split.
	ReasonModelOverruled = "ModelOverruled"
	// ReasonRelieved (WeightsApplied=True): the check between cycles found a pod whose latency
	// or CPU had jumped since the last cycle and cut its weight at once, moving the others
	// toward the capacity split when it was queueing (status.lastRelief says which and why);
	// the next cycle plans from there and raises a relieved pod's weight slowly.
	ReasonRelieved = "Relieved"
	// ReasonNoServiceEntry: there is no ServiceEntry to weight (see EndpointsMirrored).
	ReasonNoServiceEntry = "NoServiceEntry"
	// ReasonMetricsStale: the TSDB answered, but every pod's newest sample is older than twice
	// the interval: the pods are scraped too rarely for it, or the TSDB answers in the past
	// (VictoriaMetrics does, 30 s by default, when --tsdb-latency-offset=none or it ignores the
	// latency_offset argument the operator sends).
	ReasonMetricsStale = "MetricsStale"
	// ReasonQueryFailed: a query failed for every pod of the Service; the weights still use the
	// signals that work, if the algorithm has what it needs.
	ReasonQueryFailed = "QueryFailed"
	// ReasonQueryOverridesIgnored: metrics were fetched with the operator's default queries;
	// spec.metrics.queries is ignored because the operator does not allow per-Service queries
	// (--allow-query-overrides).
	ReasonQueryOverridesIgnored = "QueryOverridesIgnored"
	// ReasonPending: Ready before the endpoint mirror has reported.
	ReasonPending = "Pending"
	// ReasonFrozen: mode is Frozen; the weights in the ServiceEntry are kept as they are.
	ReasonFrozen = "Frozen"
	// ReasonOperatorUnavailable: no adaptive-lb operator runs (or sees the cluster), and the
	// fail-open watchdog deleted the ServiceEntry, or the operator was uninstalled: the Service's
	// clients use the Kubernetes endpoints, unweighted. Set by the watchdog, which stands in for
	// the endpoint mirror while no operator runs; the mirror replaces it once one does.
	ReasonOperatorUnavailable = "OperatorUnavailable"
	// ReasonInputsUnavailable: the weight cycle could not read what it needs of this Service
	// (its ServiceEntry, EndpointSlices, pods or nodes) in time; the weights are left as they
	// are, the other Services' cycles go on, and the next cycle retries.
	ReasonInputsUnavailable = "InputsUnavailable"
)
