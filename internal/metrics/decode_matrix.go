package metrics

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	jsoniter "github.com/json-iterator/go"
)

// resultTypeMatrix is the API's resultType of a range query's answer.
const resultTypeMatrix = "matrix"

// matrixResponse is what decodeMatrix read from one Prometheus HTTP API body: the envelope, and
// the points of the first series of a matrix (a history query returns one).
type matrixResponse struct {
	apiEnvelope
	resultType string
	series     int
	points     []RatePoint
}

// decodeMatrix streams a range-query body (or any API body's envelope, such as an error's). Only
// the first series' points are kept: a history query must return one, and the caller refuses an
// answer with more. Unknown fields are skipped.
func decodeMatrix(body io.Reader) (matrixResponse, error) {
	var out matrixResponse
	var err error
	out.apiEnvelope, err = decodeEnvelope(body, func(iter *jsoniter.Iterator) error {
		return decodeMatrixData(iter, &out)
	})
	return out, err
}

// decodeMatrixData reads the data object; the result is decoded only when resultType says matrix,
// whichever of the two fields comes first.
func decodeMatrixData(iter *jsoniter.Iterator, out *matrixResponse) error {
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
			switch out.resultType {
			case "":
				raw = iter.SkipAndReturnBytes()
			case resultTypeMatrix:
				err = decodeMatrixResult(iter, out)
			default:
				iter.Skip()
			}
		default:
			iter.Skip()
		}
		return iter.Error == nil && err == nil
	})
	if err != nil || iter.Error != nil {
		return err
	}
	if raw != nil && out.resultType == resultTypeMatrix {
		sub := jsoniter.ConfigFastest.BorrowIterator(raw)
		defer jsoniter.ConfigFastest.ReturnIterator(sub)
		if err := decodeMatrixResult(sub, out); err != nil {
			return err
		}
		if sub.Error != nil {
			return fmt.Errorf("%w: %v", ErrMalformedResponse, sub.Error)
		}
	}
	return nil
}

// decodeMatrixResult reads [{"metric":{...},"values":[[<ts>,"<val>"],...]}, ...], keeping the
// first series' points.
func decodeMatrixResult(iter *jsoniter.Iterator, out *matrixResponse) error {
	var err error
	iter.ReadArrayCB(func(iter *jsoniter.Iterator) bool {
		keep := out.series == 0
		out.series++
		iter.ReadObjectCB(func(iter *jsoniter.Iterator, field string) bool {
			if field != "values" || !keep {
				iter.Skip()
				return true
			}
			iter.ReadArrayCB(func(iter *jsoniter.Iterator) bool {
				var p RatePoint
				p, err = decodeRatePoint(iter)
				if err == nil {
					out.points = append(out.points, p)
				}
				return err == nil && iter.Error == nil
			})
			return err == nil && iter.Error == nil
		})
		return err == nil && iter.Error == nil
	})
	return err
}

// decodeRatePoint reads [<unix seconds>, "<value>"].
func decodeRatePoint(iter *jsoniter.Iterator) (RatePoint, error) {
	var p RatePoint
	var err error
	i := 0
	iter.ReadArrayCB(func(iter *jsoniter.Iterator) bool {
		switch i {
		case 0:
			ts := iter.ReadFloat64()
			if iter.Error == nil && (math.IsNaN(ts) || math.IsInf(ts, 0)) {
				err = fmt.Errorf("%w: sample timestamp %v", ErrMalformedResponse, ts)
			}
			sec, frac := math.Modf(ts)
			p.Time = time.Unix(int64(sec), int64(math.Round(frac*1e9))).UTC()
		case 1:
			s := iter.ReadString()
			if iter.Error == nil {
				p.Rate, err = strconv.ParseFloat(s, 64)
				if errors.Is(err, strconv.ErrRange) {
					err = nil // ±Inf: passed on, for the caller to skip
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
	return p, err
}
