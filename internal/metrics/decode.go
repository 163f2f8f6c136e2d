package metrics

import (
	"errors"
	"fmt"
	"io"
	"strconv"

	jsoniter "github.com/json-iterator/go"
	"github.com/prometheus/common/model"
)

// decodeBufferBytes is the read buffer of the streaming decoder: the body is never held whole.
const decodeBufferBytes = 64 << 10

// resultTypeVector is the API's resultType of an instant vector.
const resultTypeVector = "vector"

// apiResponse is what decodeQueryResponse read from one Prometheus HTTP API body.
type apiResponse struct {
	apiEnvelope
	// resultType is empty when the body had no data object.
	resultType string
	result     podValues
	series     int
	// histogram, when set before decoding, makes the series go to buckets by their le label
	// instead of to result.
	histogram bool
	buckets   podHistograms
}

// decodeQueryResponse streams an instant-query body straight into per-pod values: the body is read
// through a small buffer and never held whole. Only the two pod label values are kept for each
// series (other labels are kept only when a series carries any, so a duplicate can name them);
// values are parsed with strconv.ParseFloat. Unknown fields are skipped. Series are attributed
// through the cycle's pod index. See docs/metrics.md ("Why the cycle does not use v1's decoder").
func decodeQueryResponse(body io.Reader, labels Labels, index *podIndex) (apiResponse, error) {
	return decodeResponse(body, labels, index, false)
}

// decodeResponse is decodeQueryResponse; with histogram, the series of a latency histogram query
// (one per pod and le) go to buckets instead.
func decodeResponse(body io.Reader, labels Labels, index *podIndex, histogram bool) (apiResponse, error) {
	out := apiResponse{histogram: histogram}
	var err error
	out.apiEnvelope, err = decodeEnvelope(body, func(iter *jsoniter.Iterator) error {
		return decodeData(iter, labels, index, &out)
	})
	return out, err
}

// apiEnvelope is what every Prometheus HTTP API body says around its data.
type apiEnvelope struct {
	status    string
	errorType string
	errorText string
	warnings  []string
}

// decodeEnvelope streams a Prometheus HTTP API body: the envelope's fields into the result, the
// data object to data. Unknown fields are skipped; a status other than success or error is a
// malformed response.
func decodeEnvelope(body io.Reader, data func(*jsoniter.Iterator) error) (apiEnvelope, error) {
	var out apiEnvelope
	iter := jsoniter.Parse(jsoniter.ConfigFastest, body, decodeBufferBytes)
	var dataErr error
	iter.ReadObjectCB(func(iter *jsoniter.Iterator, field string) bool {
		switch field {
		case "status":
			out.status = iter.ReadString()
		case "errorType":
			out.errorType = iter.ReadString()
		case "error":
			out.errorText = iter.ReadString()
		case "warnings":
			iter.ReadArrayCB(func(iter *jsoniter.Iterator) bool {
				out.warnings = append(out.warnings, iter.ReadString())
				return true
			})
		case "data":
			dataErr = data(iter)
		default:
			iter.Skip()
		}
		return iter.Error == nil && dataErr == nil
	})
	if iter.Error != nil {
		return out, fmt.Errorf("%w: %v", ErrMalformedResponse, iter.Error)
	}
	if dataErr != nil {
		return out, dataErr
	}
	if out.status != "success" && out.status != "error" {
		return out, fmt.Errorf("%w: status is %q, want \"success\" or \"error\" (is the URL a Prometheus-compatible API?)", ErrMalformedResponse, out.status)
	}
	return out, nil
}

// decodeData reads the data object. The result is decoded only when resultType says vector,
// whichever of the two fields comes first.
func decodeData(iter *jsoniter.Iterator, labels Labels, index *podIndex, out *apiResponse) error {
	if iter.WhatIsNext() == jsoniter.NilValue {
		iter.Skip()
		return nil
	}
	var err error
	var raw []byte // the result, kept only when it precedes resultType
	iter.ReadObjectCB(func(iter *jsoniter.Iterator, field string) bool {
		switch field {
		case "resultType":
			out.resultType = iter.ReadString()
		case "result":
			if out.resultType == "" {
				raw = iter.SkipAndReturnBytes()
				return true
			}
			if out.resultType != resultTypeVector {
				iter.Skip()
				return true
			}
			err = decodeVector(iter, labels, index, out)
		default:
			iter.Skip()
		}
		return iter.Error == nil && err == nil
	})
	if err != nil || iter.Error != nil {
		return err
	}
	if raw != nil && out.resultType == resultTypeVector {
		sub := jsoniter.ConfigFastest.BorrowIterator(raw)
		defer jsoniter.ConfigFastest.ReturnIterator(sub)
		if err := decodeVector(sub, labels, index, out); err != nil {
			return err
		}
		if sub.Error != nil {
			return fmt.Errorf("%w: %v", ErrMalformedResponse, sub.Error)
		}
	}
	return nil
}

func decodeVector(iter *jsoniter.Iterator, labels Labels, index *podIndex, out *apiResponse) error {
	if out.histogram {
		out.buckets = newPodHistograms(index)
	} else {
		out.result = newPodValues(index, labels)
	}
	var err error
	iter.ReadArrayCB(func(iter *jsoniter.Iterator) bool {
		err = decodeSeries(iter, labels, out)
		out.series++
		return err == nil && iter.Error == nil
	})
	return err
}

// decodeSeries reads {"metric":{...},"value":[<ts>,"<val>"]}.
func decodeSeries(iter *jsoniter.Iterator, labels Labels, out *apiResponse) error {
	var ns, pod, le string
	var others model.Metric
	var value float64
	var haveValue bool
	var err error
	iter.ReadObjectCB(func(iter *jsoniter.Iterator, field string) bool {
		switch field {
		case "metric":
			iter.ReadObjectCB(func(iter *jsoniter.Iterator, name string) bool {
				v := iter.ReadString()
				switch name {
				case labels.Namespace:
					ns = v
				case labels.Pod:
					pod = v
				case "le":
					if out.histogram {
						le = v
						break
					}
					fallthrough
				default:
					if others == nil {
						others = model.Metric{}
					}
					others[model.LabelName(name)] = model.LabelValue(v)
				}
				return true
			})
		case "value":
			value, err = decodeSamplePair(iter)
			haveValue = err == nil
		default:
			iter.Skip()
		}
		return err == nil && iter.Error == nil
	})
	if err != nil || iter.Error != nil {
		return err
	}
	if !haveValue {
		return fmt.Errorf("%w: series %d has no value", ErrMalformedResponse, out.series)
	}
	if out.histogram {
		out.buckets.add(ns, pod, le, value)
		return nil
	}
	out.result.add(ns, pod, value, others)
	return nil
}

// decodeSamplePair reads [<unix seconds>, "<value>"]; the timestamp is the evaluation time and
// is not needed (freshness comes from the probes).
func decodeSamplePair(iter *jsoniter.Iterator) (float64, error) {
	var value float64
	var err error
	i := 0
	iter.ReadArrayCB(func(iter *jsoniter.Iterator) bool {
		switch i {
		case 0:
			iter.Skip()
		case 1:
			// The value is a number's text ("0.5", "NaN", "+Inf"): read in place, without
			// allocating a string per series. An escape in it fails the parse below or the
			// JSON syntax, both reported as a malformed response.
			s := iter.ReadStringAsSlice()
			if iter.Error == nil {
				value, err = strconv.ParseFloat(string(s), 64)
				if errors.Is(err, strconv.ErrRange) {
					err = nil // ±Inf: rejected per pod as non-finite, like "+Inf"
				}
				if err != nil {
					err = fmt.Errorf("%w: sample value %q: %v", ErrMalformedResponse, s, errors.Unwrap(err))
				}
			}
		default:
			err = fmt.Errorf("%w: sample pair has more than two elements", ErrMalformedResponse)
		}
		i++
		return err == nil && iter.Error == nil
	})
	if err == nil && iter.Error == nil && i != 2 {
		err = fmt.Errorf("%w: sample pair has %d elements, want [timestamp, \"value\"]", ErrMalformedResponse, i)
	}
	return value, err
}
