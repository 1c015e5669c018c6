// Package threshold sends quota threshold events (issue 23, item 5) to an
// operator's webhook: a core.QuotaObserver that queues each threshold a
// request reaches, off the request path, and a goroutine that claims each
// event's id (so gateways of one data plane, and a gateway restarted,
// send it once) and posts it, signed with HMAC-SHA256, retrying with
// exponential backoff.
package threshold

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/metrics"
)

// SignatureHeader carries an event's signature: "sha256=" and the hex
// HMAC-SHA256 of the request body under Options.Secret. A receiver
// computes the same over the body it read and compares in constant time.
const SignatureHeader = "X-Limitplane-Signature"

// EventIDHeader repeats the event's id, so a receiver can drop a repeat
// (a retry after a lost answer) before parsing the body.
const EventIDHeader = "X-Limitplane-Event-Id"

// Event is what the webhook receives, as the JSON body of a POST.
type Event struct {
	// ID is deterministic (EventID): the hex of the first 16 bytes of
	// SHA-256 over the consumer, API, policy, threshold, period start
	// (Unix seconds), epoch and endpoint, so every data-plane member
	// names one event alike.
	ID string `json:"id"`
	// Consumer is the consumer's ID ("key:<32 hex>" for an API key: the
	// key hash's ConsumerID, never the key).
	Consumer string `json:"consumer"`
	API      string `json:"api"`
	// Endpoint is, for the quota of an endpoint of the API, its method
	// and canonical path ("POST /orders", "* /orders/{}":
	// core.ThresholdReached.Endpoint); left out for the API's own quota.
	Endpoint string `json:"endpoint,omitempty"`
	Policy   string `json:"policy"`
	// Threshold is the percentage reached; Units the count it stands
	// for; Used the count after the request that reached it; Quota the
	// quota's Max.
	Threshold int64  `json:"threshold"`
	Units     int64  `json:"units"`
	Used      int64  `json:"used"`
	Quota     int64  `json:"quota"`
	Epoch     uint64 `json:"epoch"`
	// PeriodStart and PeriodEnd bound the quota period, to the second.
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
	// DataPlane is Options.DataPlane; At when the request reached it.
	DataPlane string    `json:"data_plane,omitempty"`
	At        time.Time `json:"at"`
}

// Claimer claims event ids, so an event is sent once by whichever
// process claims it first. Claim reports whether id was not claimed
// before; the claim lasts until until (the quota period's end).
// Release drops a claim whose event could not be delivered.
type Claimer interface {
	Claim(ctx context.Context, id string, until time.Time) (bool, error)
	Release(ctx context.Context, id string) error
}

// Recorder is implemented by a Claimer that also keeps each event it
// claimed for a report (RedisClaimer with Reports: the control plane's
// usage). Record is called once per event claimed, before it is sent.
type Recorder interface {
	Record(ctx context.Context, e Event) error
}

// Options configure a Notifier.
type Options struct {
	// URL is the webhook's http(s) URL; required.
	URL string
	// Secret is the HMAC-SHA256 key of SignatureHeader; required.
	Secret []byte
	// Timeout bounds one attempt; default 5 s.
	Timeout time.Duration
	// Queue is the most events waiting to be sent; default 1024. An
	// event that finds it full is dropped and counted (Stats.Dropped):
	// the request path never waits.
	Queue int
	// RetryFor bounds the retries of one event (exponential backoff
	// from 100 ms, at most 10 s apart); default 1 min. An event not
	// delivered by then is counted failed and its claim released.
	RetryFor time.Duration
	// Senders is how many events are sent at once; default 4. An event
	// whose receiver does not answer holds one sender for up to
	// RetryFor, not the events behind it.
	Senders int
	// Claimer claims event ids; nil means an in-process set (NewMemoryClaimer
	// with its default bound): one process sends each event once.
	// Gateways sharing a Redis use NewRedisClaimer on it.
	Claimer Claimer
	// DataPlane names the sender in events.
	DataPlane string
	// Client sends the requests; nil means a client of its own.
	Client *http.Client
	// Logger logs deliveries that failed; nil means slog.Default.
	Logger *slog.Logger
	// Now is the wall clock; nil means time.Now.
	Now func() time.Time
	// Sent, if set, is called after each event is delivered or given
	// up (err not nil), from the sending goroutine.
	Sent func(e Event, err error)
}

// Stats count a Notifier's events since it started.
type Stats struct {
	// Queued events were taken into the queue; Dropped found it full,
	// or were still in it when the Notifier closed.
	Queued, Dropped int64
	// Delivered were answered 2xx; Duplicates were claimed by another
	// process (or before) and not sent; Failed were given up.
	Delivered, Duplicates, Failed int64
}

// Notifier is a core.QuotaObserver that sends threshold events to a
// webhook. Close stops it.
type Notifier struct {
	o      Options
	queue  chan reached
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	queued, dropped, delivered, duplicates, failed atomic.Int64
	unsent                                         atomic.Int64 // taken or left at Close, not sent
}

var _ core.QuotaObserver = (*Notifier)(nil)

// New starts a Notifier: Options.Senders goroutines sending queued
// events, stopped by Close.
func New(o Options) (*Notifier, error) {
	if o.URL == "" {
		return nil, errors.New("threshold: no webhook URL")
	}
	if len(o.Secret) == 0 {
		return nil, errors.New("threshold: no webhook secret")
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Queue <= 0 {
		o.Queue = 1024
	}
	if o.RetryFor <= 0 {
		o.RetryFor = time.Minute
	}
	if o.Senders <= 0 {
		o.Senders = 4
	}
	if o.Claimer == nil {
		o.Claimer = NewMemoryClaimer(0, o.Now)
	}
	if o.Client == nil {
		o.Client = &http.Client{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	n := &Notifier{o: o, queue: make(chan reached, o.Queue)}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.wg.Add(o.Senders)
	for range o.Senders {
		go n.run()
	}
	return n, nil
}

// ObserveThreshold implements core.QuotaObserver: it queues what the
// event is made of (the event itself, its id hashed, is made by the
// sending goroutine), or drops it when the queue is full. It never
// blocks; it copies the consumer's ID, which may be in memory the caller
// reuses (an adapter's pooled consumer), its one allocation.
func (n *Notifier) ObserveThreshold(c *core.Consumer, t core.ThresholdReached) {
	select {
	case n.queue <- reached{consumer: strings.Clone(c.ID), t: t, at: n.o.Now()}:
		n.queued.Add(1)
	default:
		n.dropped.Add(1)
	}
}

// reached is a queued threshold.
type reached struct {
	consumer string
	t        core.ThresholdReached
	at       time.Time
}

// event makes r's Event: the period's end is the time of the request
// plus the quota's ResetAfter, to the second (so every process computes
// the same from its own clock), its start that less the renewal.
func (n *Notifier) event(r reached) Event {
	t := r.t
	end := r.at.Add(t.Quota.ResetAfter).Round(time.Second)
	start := end.Add(-t.Quota.Window)
	e := Event{Consumer: r.consumer, API: t.API, Endpoint: t.Endpoint, Policy: t.Policy, Threshold: t.Percent, Units: t.Units,
		Used: t.Quota.Limit - t.Quota.Remaining, Quota: t.Quota.Limit, Epoch: t.Epoch,
		PeriodStart: start.UTC(), PeriodEnd: end.UTC(), DataPlane: n.o.DataPlane, At: r.at.UTC()}
	e.ID = EventID(e.Consumer, e.API, e.Endpoint, e.Policy, e.Threshold, start, e.Epoch)
	return e
}

// EventID returns the id of the event of consumer reaching percent of
// policy's quota on api (at endpoint, its EndpointKey; "" for the API's
// own quota) in the period starting at start (to the second) under
// epoch. An API's own quota's id hashes no endpoint, so its ids are those
// of releases before endpoints had thresholds.
func EventID(consumer, api, endpoint, policy string, percent int64, start time.Time, epoch uint64) string {
	h := sha256.New()
	for _, s := range []string{consumer, api, policy, strconv.FormatInt(percent, 10), strconv.FormatInt(start.Unix(), 10), strconv.FormatUint(epoch, 10)} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	if endpoint != "" {
		h.Write([]byte(endpoint))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Stats returns the counts so far.
func (n *Notifier) Stats() Stats {
	return Stats{Queued: n.queued.Load(), Dropped: n.dropped.Load(), Delivered: n.delivered.Load(),
		Duplicates: n.duplicates.Load(), Failed: n.failed.Load()}
}

// MetricStats returns Stats as metrics.NewThresholds reads them.
func (n *Notifier) MetricStats() metrics.ThresholdStats {
	s := n.Stats()
	return metrics.ThresholdStats{Queued: s.Queued, Dropped: s.Dropped, Delivered: s.Delivered, Duplicates: s.Duplicates, Failed: s.Failed}
}

// Close stops the senders: an attempt in flight is cancelled, and events
// still queued are not sent: they are counted dropped and logged. It waits
// for the senders to end.
func (n *Notifier) Close() error {
	n.once.Do(func() {
		n.cancel()
		n.wg.Wait()
		for len(n.queue) > 0 { // the senders have stopped: no one else reads
			<-n.queue
			n.unsent.Add(1)
		}
		if left := n.unsent.Load(); left > 0 {
			n.dropped.Add(left)
			n.o.Logger.Warn("threshold webhook: closed with events not sent", "events", left)
		}
	})
	n.wg.Wait()
	return nil
}

func (n *Notifier) run() {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case r := <-n.queue:
			if n.ctx.Err() != nil {
				// Closed while both were ready: not sent, counted with
				// those Close finds queued.
				n.unsent.Add(1)
				return
			}
			n.send(n.event(r))
		}
	}
}

// send claims e's id and posts it until it is delivered, RetryFor
// passes or the Notifier closes.
func (n *Notifier) send(e Event) {
	ok, err := n.o.Claimer.Claim(n.ctx, e.ID, e.PeriodEnd)
	if err != nil {
		n.failed.Add(1)
		if n.ctx.Err() == nil {
			n.o.Logger.Warn("threshold webhook: claim failed; event not sent", "id", e.ID, "err", err)
		}
		n.report(e, fmt.Errorf("threshold: claim %s: %w", e.ID, err))
		return
	}
	if !ok {
		n.duplicates.Add(1)
		return
	}
	if rec, ok := n.o.Claimer.(Recorder); ok {
		if err := rec.Record(n.ctx, e); err != nil {
			n.o.Logger.Warn("threshold webhook: the event is not reported to the control plane", "id", e.ID, "err", err)
		}
	}
	body, err := json.Marshal(e)
	if err != nil {
		n.failed.Add(1)
		n.report(e, err)
		return
	}
	sig := Sign(n.o.Secret, body)
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 100*time.Millisecond, 10*time.Second
	attempts := 0
	_, err = backoff.Retry(n.ctx, func() (struct{}, error) {
		err := n.post(body, sig, e.ID)
		if attempts++; err != nil && attempts == 1 && n.ctx.Err() == nil {
			// Said once per event, at once: a receiver that is down
			// shows before RetryFor runs out.
			n.o.Logger.Warn("threshold webhook: attempt failed; retrying", "id", e.ID, "consumer", e.Consumer, "api", e.API,
				"policy", e.Policy, "threshold", e.Threshold, "retry_for", n.o.RetryFor, "err", err)
		}
		return struct{}{}, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(n.o.RetryFor))
	if err != nil {
		n.failed.Add(1)
		if n.ctx.Err() == nil {
			n.o.Logger.Warn("threshold webhook: event not delivered", "id", e.ID, "consumer", e.Consumer, "api", e.API,
				"policy", e.Policy, "threshold", e.Threshold, "attempts", attempts, "err", err)
		}
		// Another crossing of the same event (after a refund) may try again.
		rctx, cancel := context.WithTimeout(context.Background(), n.o.Timeout)
		n.o.Claimer.Release(rctx, e.ID)
		cancel()
		n.report(e, err)
		return
	}
	n.delivered.Add(1)
	n.report(e, nil)
}

func (n *Notifier) report(e Event, err error) {
	if n.o.Sent != nil {
		n.o.Sent(e, err)
	}
}

// post makes one attempt; a 4xx other than 408 and 429 is permanent.
func (n *Notifier) post(body []byte, sig, id string) error {
	ctx, cancel := context.WithTimeout(n.ctx, n.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.o.URL, bytes.NewReader(body))
	if err != nil {
		return backoff.Permanent(fmt.Errorf("threshold: webhook request: %w", err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(SignatureHeader, sig)
	req.Header.Set(EventIDHeader, id)
	resp, err := n.o.Client.Do(req)
	if err != nil {
		return fmt.Errorf("threshold: webhook: %w", err)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests:
		return backoff.Permanent(fmt.Errorf("threshold: webhook answered %d", resp.StatusCode))
	}
	return fmt.Errorf("threshold: webhook answered %d", resp.StatusCode)
}

// Sign returns SignatureHeader's value for body under secret, for
// receivers and tests.
func Sign(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}
