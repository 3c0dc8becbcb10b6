// Command riverinterop drives the real River Go library for river_anyio's interoperability
// tests. Every subcommand takes -url (postgres://... or River's sqlite://relative and sqlite:///absolute) and writes JSON to
// stdout: one document for the one-shot commands, one JSON object per line for `run`.
//
//	migrate   -direction up|down [-target-version N]  -> {"versions":[...]}
//	versions                                          -> {"versions":[...]}
//	validate                                          -> {"ok":bool,"messages":[...]}
//	insert    (JSON list of jobs on stdin)            -> [{"id":..,"skipped":..,...}, ...]
//	get       -ids 1,2,3                              -> [row, ...]
//	pause / resume -queue Q
//	cancel    -id N                                   -> row
//	run       -queues q:n,... [-id ID] [-kinds k,...] [-fetch-only-known-kinds]
//	          [-leader-election-disabled] [-report-leader]
//	          JSON lines: started, job_started, job_* / queue_* events, leader and
//	          elector (with -report-leader), stopped.
//	          Stops gracefully on "stop" or EOF on stdin.
package main

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
)

// ---------------------------------------------------------------------------
// Output

var outMu sync.Mutex //nolint:gochecknoglobals

func emit(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		fail(err)
	}
	outMu.Lock()
	defer outMu.Unlock()
	os.Stdout.Write(append(b, '\n'))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "riverinterop:", err)
	os.Exit(1)
}

// ---------------------------------------------------------------------------
// Database access, generic over the two drivers

type database struct {
	dialect string
	pg      *pgxpool.Pool
	sqlite  *sql.DB
}

func openDatabase(ctx context.Context, url string) (*database, error) {
	if path, ok := strings.CutPrefix(url, "sqlite://"); ok {
		// busy_timeout: another process (river_anyio) shares the file; immediate write
		// transactions avoid lock upgrades that fail without waiting.
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(20000)&_pragma=journal_mode(wal)&_txlock=immediate")
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(1) // as River's SQLite driver recommends
		return &database{dialect: "sqlite", sqlite: db}, nil
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	return &database{dialect: "postgres", pg: pool}, nil
}

func (d *database) close() {
	if d.pg != nil {
		d.pg.Close()
	}
	if d.sqlite != nil {
		d.sqlite.Close()
	}
}

// queryString runs a query returning at most one text column of one row ("" when no row).
func (d *database) queryString(ctx context.Context, query string) (string, error) {
	var (
		s   *string
		err error
	)
	if d.pg != nil {
		err = d.pg.QueryRow(ctx, query).Scan(&s)
	} else {
		err = d.sqlite.QueryRowContext(ctx, query).Scan(&s)
	}
	if errors.Is(err, sql.ErrNoRows) || (err != nil && err.Error() == "no rows in result set") {
		return "", nil
	}
	if err != nil || s == nil {
		return "", err
	}
	return *s, nil
}

// api is what the subcommands use of River, whatever the driver's transaction type.
type api struct {
	insert   func(context.Context, []river.InsertManyParams) ([]*rivertype.JobInsertResult, error)
	jobGet   func(context.Context, int64) (*rivertype.JobRow, error)
	cancel   func(context.Context, int64) (*rivertype.JobRow, error)
	pause    func(context.Context, string) error
	resume   func(context.Context, string) error
	start    func(context.Context) error
	stop     func(context.Context) error
	events   func(...river.EventKind) (<-chan *river.Event, func())
	clientID func() string

	migrate  func(context.Context, rivermigrate.Direction, *rivermigrate.MigrateOpts) (*rivermigrate.MigrateResult, error)
	existing func(context.Context) ([]rivermigrate.Migration, error)
	validate func(context.Context) (*rivermigrate.ValidateResult, error)
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// electorLogger logs warnings to stderr like quietLogger, and also prints every record of
// River's leadership elector (debug level included) as an "elector" line: River Go's own
// account of its bids, elections, resignations and the leadership notifications it received.
func electorLogger() *slog.Logger {
	return slog.New(&electorHandler{inner: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})})
}

type electorHandler struct {
	inner slog.Handler
	attrs []slog.Attr
}

func (h *electorHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *electorHandler) Handle(ctx context.Context, r slog.Record) error {
	// The elector prefixes its messages with its service name, "leadership.Elector: ".
	if _, msg, ok := strings.Cut(r.Message, "Elector: "); ok {
		out := map[string]any{"event": "elector", "message": msg}
		add := func(a slog.Attr) bool {
			out[a.Key] = a.Value.Resolve().String()
			return true
		}
		for _, a := range h.attrs {
			add(a)
		}
		r.Attrs(add)
		out["event"], out["message"] = "elector", msg
		emit(out)
	}
	if r.Level >= slog.LevelWarn {
		return h.inner.Handle(ctx, r)
	}
	return nil
}

func (h *electorHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &electorHandler{inner: h.inner.WithAttrs(attrs), attrs: append(append([]slog.Attr{}, h.attrs...), attrs...)}
}

func (h *electorHandler) WithGroup(name string) slog.Handler {
	return &electorHandler{inner: h.inner.WithGroup(name), attrs: h.attrs}
}

func newAPI(db *database, config *river.Config) (*api, error) {
	if db.pg != nil {
		return buildAPI(riverpgxv5.New(db.pg), config)
	}
	return buildAPI(riversqlite.New(db.sqlite), config)
}

func buildAPI[TTx any](drv riverdriver.Driver[TTx], config *river.Config) (*api, error) {
	a := &api{}
	m, err := rivermigrate.New(drv, &rivermigrate.Config{Logger: quietLogger()})
	if err != nil {
		return nil, err
	}
	a.migrate = m.Migrate
	a.existing = m.ExistingVersions
	a.validate = func(ctx context.Context) (*rivermigrate.ValidateResult, error) { return m.Validate(ctx, nil) }
	if config == nil {
		return a, nil
	}
	client, err := river.NewClient(drv, config)
	if err != nil {
		return nil, err
	}
	a.insert = client.InsertMany
	a.jobGet = client.JobGet
	a.cancel = client.JobCancel
	a.pause = func(ctx context.Context, q string) error { return client.QueuePause(ctx, q, nil) }
	a.resume = func(ctx context.Context, q string) error { return client.QueueResume(ctx, q, nil) }
	a.start = client.Start
	a.stop = client.Stop
	a.events = client.Subscribe
	a.clientID = client.ID
	return a, nil
}

// ---------------------------------------------------------------------------
// Job args. The typed structs are encoded by encoding/json exactly as an application's
// args would be (field order, omitempty, river:"unique" tags); DynArgs carries any JSON
// object for workers that handle a kind whatever its shape.

type DynArgs struct {
	kind string
	raw  json.RawMessage
}

func (a DynArgs) Kind() string                 { return a.kind }
func (a DynArgs) MarshalJSON() ([]byte, error) { return a.raw, nil }
func (a *DynArgs) UnmarshalJSON(b []byte) error {
	a.raw = append(json.RawMessage(nil), b...)
	return nil
}

type PlainArgs struct {
	kind  string
	Name  string         `json:"name"`
	Count int64          `json:"count"`
	Ratio float64        `json:"ratio"`
	Tags  []string       `json:"tags"`
	Meta  map[string]any `json:"meta"`
	Note  string         `json:"note,omitempty"`
}

func (a PlainArgs) Kind() string { return a.kind }

type OrderArgs struct {
	kind       string
	CustomerID string  `json:"customer_id" river:"unique"`
	TraceID    string  `json:"trace_id"`
	Amount     float64 `json:"amount" river:"unique"`
}

func (a OrderArgs) Kind() string { return a.kind }

type Address struct {
	City string `json:"city" river:"unique"`
	Zip  string `json:"zip"`
}

type MailArgs struct {
	kind    string
	Subject string  `json:"subject" river:"unique"`
	To      Address `json:"to"`
	Body    string  `json:"body"`
	Urgent  bool    `json:"urgent,omitempty" river:"unique"`
}

func (a MailArgs) Kind() string { return a.kind }

type EmptyArgs struct{ kind string }

func (a EmptyArgs) Kind() string { return a.kind }

func decodeArgs(typ, kind string, raw json.RawMessage) (river.JobArgs, error) {
	var err error
	switch typ {
	case "", "dyn":
		if len(raw) == 0 {
			raw = json.RawMessage("{}")
		}
		return DynArgs{kind: kind, raw: raw}, nil
	case "plain":
		a := PlainArgs{kind: kind}
		err = json.Unmarshal(raw, &a)
		return a, err
	case "order":
		a := OrderArgs{kind: kind}
		err = json.Unmarshal(raw, &a)
		return a, err
	case "mail":
		a := MailArgs{kind: kind}
		err = json.Unmarshal(raw, &a)
		return a, err
	case "empty":
		return EmptyArgs{kind: kind}, nil
	}
	return nil, fmt.Errorf("unknown args type %q", typ)
}

// ---------------------------------------------------------------------------
// insert

type uniqueSpec struct {
	ByArgs       bool     `json:"by_args"`
	ByPeriodSecs float64  `json:"by_period_seconds"`
	ByQueue      bool     `json:"by_queue"`
	ByState      []string `json:"by_state"`
	ExcludeKind  bool     `json:"exclude_kind"`
}

type insertSpec struct {
	Type        string          `json:"type"`
	Kind        string          `json:"kind"`
	Args        json.RawMessage `json:"args"`
	Queue       string          `json:"queue"`
	Priority    int             `json:"priority"`
	MaxAttempts int             `json:"max_attempts"`
	Tags        []string        `json:"tags"`
	Metadata    json.RawMessage `json:"metadata"`
	ScheduledAt *time.Time      `json:"scheduled_at"`
	Pending     bool            `json:"pending"`
	Unique      *uniqueSpec     `json:"unique"`
}

type insertOut struct {
	ID      int64  `json:"id"`
	Skipped bool   `json:"skipped"`
	Row     rowOut `json:"row"`
}

func cmdInsert(ctx context.Context, a *api) error {
	var specs []insertSpec
	if err := json.NewDecoder(os.Stdin).Decode(&specs); err != nil {
		return fmt.Errorf("reading jobs from stdin: %w", err)
	}
	out := make([]insertOut, 0, len(specs))
	for _, s := range specs {
		args, err := decodeArgs(s.Type, s.Kind, s.Args)
		if err != nil {
			return err
		}
		opts := &river.InsertOpts{
			Queue: s.Queue, Priority: s.Priority, MaxAttempts: s.MaxAttempts, Tags: s.Tags,
			Metadata: s.Metadata, Pending: s.Pending,
		}
		if s.ScheduledAt != nil {
			opts.ScheduledAt = *s.ScheduledAt
		}
		if u := s.Unique; u != nil {
			opts.UniqueOpts = river.UniqueOpts{
				ByArgs: u.ByArgs, ByPeriod: time.Duration(u.ByPeriodSecs * float64(time.Second)),
				ByQueue: u.ByQueue, ExcludeKind: u.ExcludeKind,
			}
			for _, st := range u.ByState {
				opts.UniqueOpts.ByState = append(opts.UniqueOpts.ByState, rivertype.JobState(st))
			}
		}
		// One insert per job: a duplicate within one batch is a different question.
		res, err := a.insert(ctx, []river.InsertManyParams{{Args: args, InsertOpts: opts}})
		if err != nil {
			return err
		}
		out = append(out, insertOut{ID: res[0].Job.ID, Skipped: res[0].UniqueSkippedAsDuplicate, Row: toRow(res[0].Job)})
	}
	emit(out)
	return nil
}

// ---------------------------------------------------------------------------
// Rows as JSON: the fields of rivertype.JobRow, args and metadata as JSON values.

type rowOut struct {
	ID           int64                    `json:"id"`
	Args         json.RawMessage          `json:"args"`
	Attempt      int                      `json:"attempt"`
	AttemptedAt  *time.Time               `json:"attempted_at"`
	AttemptedBy  []string                 `json:"attempted_by"`
	CreatedAt    time.Time                `json:"created_at"`
	Errors       []rivertype.AttemptError `json:"errors"`
	FinalizedAt  *time.Time               `json:"finalized_at"`
	Kind         string                   `json:"kind"`
	MaxAttempts  int                      `json:"max_attempts"`
	Metadata     json.RawMessage          `json:"metadata"`
	Priority     int                      `json:"priority"`
	Queue        string                   `json:"queue"`
	ScheduledAt  time.Time                `json:"scheduled_at"`
	State        string                   `json:"state"`
	Tags         []string                 `json:"tags"`
	UniqueKey    *string                  `json:"unique_key"`
	UniqueStates []string                 `json:"unique_states"`
}

func toRow(j *rivertype.JobRow) rowOut {
	r := rowOut{
		ID: j.ID, Args: j.EncodedArgs, Attempt: j.Attempt, AttemptedAt: j.AttemptedAt,
		AttemptedBy: j.AttemptedBy, CreatedAt: j.CreatedAt, Errors: j.Errors,
		FinalizedAt: j.FinalizedAt, Kind: j.Kind, MaxAttempts: j.MaxAttempts,
		Metadata: j.Metadata, Priority: j.Priority, Queue: j.Queue, ScheduledAt: j.ScheduledAt,
		State: string(j.State), Tags: j.Tags,
	}
	if len(r.Args) == 0 {
		r.Args = json.RawMessage("null")
	}
	if len(r.Metadata) == 0 {
		r.Metadata = json.RawMessage("null")
	}
	if j.UniqueKey != nil {
		k := hex.EncodeToString(j.UniqueKey)
		r.UniqueKey = &k
	}
	for _, s := range j.UniqueStates {
		r.UniqueStates = append(r.UniqueStates, string(s))
	}
	return r
}

func cmdGet(ctx context.Context, a *api, ids string) error {
	out := []rowOut{}
	for _, s := range strings.Split(ids, ",") {
		id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return err
		}
		row, err := a.jobGet(ctx, id)
		if err != nil {
			return fmt.Errorf("job %d: %w", id, err)
		}
		out = append(out, toRow(row))
	}
	emit(out)
	return nil
}

// ---------------------------------------------------------------------------
// migrations

func versionNumbers(ms []rivermigrate.Migration) []int {
	out := []int{}
	for _, m := range ms {
		out = append(out, m.Version)
	}
	return out
}

func cmdMigrate(ctx context.Context, a *api, direction string, target int) error {
	res, err := a.migrate(ctx, rivermigrate.Direction(direction), &rivermigrate.MigrateOpts{TargetVersion: target})
	if err != nil {
		return err
	}
	applied := []int{}
	for _, v := range res.Versions {
		applied = append(applied, v.Version)
	}
	existing, err := a.existing(ctx)
	if err != nil {
		return err
	}
	emit(map[string]any{"applied": applied, "versions": versionNumbers(existing)})
	return nil
}

// ---------------------------------------------------------------------------
// run: a client working queues, reporting as JSON lines

// behaviour is what a job's args ask the worker to do (every kind shares this worker).
type behaviour struct {
	Action        string          `json:"action"` // complete (default), error, snooze, cancel, sleep, output
	Message       string          `json:"message"`
	SnoozeSeconds float64         `json:"snooze_seconds"`
	SleepSeconds  float64         `json:"sleep_seconds"`
	RetryInSecs   *float64        `json:"retry_in_seconds"`
	Output        json.RawMessage `json:"output"`
	// FailAttempts: with "error", fail while attempt <= FailAttempts, then complete (0: always).
	FailAttempts int `json:"fail_attempts"`
	// SnoozeTimes: with "snooze", snooze until metadata "snoozes" reaches it, then complete
	// (0: always).
	SnoozeTimes int `json:"snooze_times"`
}

type dynWorker struct {
	river.WorkerDefaults[DynArgs]
}

func (w *dynWorker) NextRetry(job *river.Job[DynArgs]) time.Time {
	var b behaviour
	_ = json.Unmarshal(job.Args.raw, &b)
	if b.RetryInSecs == nil {
		return time.Time{}
	}
	return time.Now().Add(time.Duration(*b.RetryInSecs * float64(time.Second)))
}

func (w *dynWorker) Work(ctx context.Context, job *river.Job[DynArgs]) error {
	var b behaviour
	_ = json.Unmarshal(job.Args.raw, &b)
	emit(map[string]any{
		"event": "job_started", "id": job.ID, "kind": job.Kind, "attempt": job.Attempt,
		"args": job.Args.raw, "errors": job.Errors, "metadata": json.RawMessage(job.Metadata),
		"attempted_by": job.AttemptedBy, "queue": job.Queue,
	})
	switch b.Action {
	case "", "complete":
		return nil
	case "output":
		return river.RecordOutput(ctx, b.Output)
	case "error":
		if b.FailAttempts == 0 || job.Attempt <= b.FailAttempts {
			return errors.New(b.Message)
		}
		return nil
	case "snooze":
		var meta struct {
			Snoozes int `json:"snoozes"`
		}
		_ = json.Unmarshal(job.Metadata, &meta)
		if b.SnoozeTimes > 0 && meta.Snoozes >= b.SnoozeTimes {
			return nil
		}
		return river.JobSnooze(time.Duration(b.SnoozeSeconds * float64(time.Second)))
	case "cancel":
		return river.JobCancel(errors.New(b.Message))
	case "sleep":
		d := time.Duration(b.SleepSeconds * float64(time.Second))
		if d == 0 {
			d = time.Hour
		}
		select {
		case <-ctx.Done():
			emit(map[string]any{"event": "job_context_done", "id": job.ID, "cause": context.Cause(ctx).Error()})
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	return fmt.Errorf("unknown action %q", b.Action)
}

func eventOut(e *river.Event) map[string]any {
	out := map[string]any{"event": string(e.Kind)}
	if e.Job != nil {
		out["id"] = e.Job.ID
		out["job"] = toRow(e.Job)
	}
	if e.Queue != nil {
		out["queue"] = e.Queue.Name
	}
	return out
}

type runFlags struct {
	queues                 string
	id                     string
	kinds                  string
	fetchOnlyKnownKinds    bool
	leaderElectionDisabled bool
	reportLeader           bool
}

func cmdRun(ctx context.Context, db *database, f runFlags) error {
	workers := river.NewWorkers()
	for _, kind := range strings.Split(f.kinds, ",") {
		if kind = strings.TrimSpace(kind); kind != "" {
			river.AddWorkerArgs(workers, DynArgs{kind: kind}, &dynWorker{})
		}
	}
	queues := map[string]river.QueueConfig{}
	for _, q := range strings.Split(f.queues, ",") {
		if q = strings.TrimSpace(q); q == "" {
			continue
		}
		name, n, _ := strings.Cut(q, ":")
		max, err := strconv.Atoi(n)
		if err != nil {
			max = 10
		}
		queues[name] = river.QueueConfig{MaxWorkers: max}
	}
	logger := quietLogger()
	if f.reportLeader {
		logger = electorLogger()
	}
	config := &river.Config{
		ID:                     f.id,
		Logger:                 logger,
		Queues:                 queues,
		Workers:                workers,
		FetchCooldown:          20 * time.Millisecond,
		FetchPollInterval:      200 * time.Millisecond,
		FetchOnlyKnownKinds:    f.fetchOnlyKnownKinds,
		LeaderElectionDisabled: f.leaderElectionDisabled,
		JobTimeout:             -1,
	}
	a, err := newAPI(db, config)
	if err != nil {
		return err
	}
	events, unsubscribe := a.events(
		river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled,
		river.EventKindJobSnoozed, river.EventKindJobInterrupted,
		river.EventKindQueuePaused, river.EventKindQueueResumed,
	)
	defer unsubscribe()
	if err := a.start(ctx); err != nil {
		return err
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case e, ok := <-events:
				if !ok {
					return
				}
				emit(eventOut(e))
			case <-done:
				return
			}
		}
	}()
	if f.reportLeader {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reportLeader(ctx, db, a.clientID(), done)
		}()
	}
	emit(map[string]any{"event": "started", "client_id": a.clientID()})

	// Stop on "stop" or end of input.
	lines := make(chan string)
	go func() {
		buf := make([]byte, 4096)
		var acc string
		for {
			n, err := os.Stdin.Read(buf)
			acc += string(buf[:n])
			for {
				line, rest, ok := strings.Cut(acc, "\n")
				if !ok {
					break
				}
				acc = rest
				lines <- strings.TrimSpace(line)
			}
			if err != nil {
				close(lines)
				return
			}
		}
	}()
	for line := range lines {
		if line == "stop" {
			break
		}
	}
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = a.stop(stopCtx)
	close(done) // the event goroutine has emitted what arrived before the stop returned
	wg.Wait()
	emit(map[string]any{"event": "stopped"})
	return err
}

// reportLeader emits a "leader" line whenever this client's leadership changes, read from
// river_leader (River Go has no public leadership API).
func reportLeader(ctx context.Context, db *database, id string, done <-chan struct{}) {
	was := false
	first := true
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		leader, err := db.queryString(ctx, "SELECT leader_id FROM river_leader")
		if err == nil {
			is := leader == id
			if first || is != was {
				emit(map[string]any{"event": "leader", "is_leader": is, "leader_id": leader})
				was, first = is, false
			}
		}
		select {
		case <-done:
			return
		case <-tick.C:
		}
	}
}

// ---------------------------------------------------------------------------
// bench: River Go's drain of n no-op jobs (PostgreSQL), timed as river-anyio bench -n times
// its own: every job is inserted first, then the clock runs from the client's start until the
// last job is completed.

type benchArgs struct {
	N int `json:"n"`
}

func (benchArgs) Kind() string { return "river_go_bench" }

type benchWorker struct {
	river.WorkerDefaults[benchArgs]
}

func (w *benchWorker) Work(ctx context.Context, job *river.Job[benchArgs]) error { return nil }

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func cmdBench(ctx context.Context, db *database, n, maxWorkers int, cooldown time.Duration) error {
	if db.pg == nil {
		return errors.New("bench: PostgreSQL only")
	}
	if _, err := db.pg.Exec(ctx, "DELETE FROM river_job"); err != nil {
		return err
	}
	inserter, err := river.NewClient(riverpgxv5.New(db.pg), &river.Config{Logger: quietLogger()})
	if err != nil {
		return err
	}
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: benchArgs{N: i}}
	}
	for lo := 0; lo < n; lo += 5000 {
		if _, err := inserter.InsertManyFast(ctx, params[lo:min(lo+5000, n)]); err != nil {
			return err
		}
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &benchWorker{})
	config := &river.Config{
		Logger:  quietLogger(),
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers: workers,
	}
	if cooldown > 0 {
		config.FetchCooldown = cooldown
	}
	client, err := river.NewClient(riverpgxv5.New(db.pg), config)
	if err != nil {
		return err
	}
	// River drops events a full subscription channel cannot take: room for all of them
	completed, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: n,
		Kinds:    []river.EventKind{river.EventKindJobCompleted},
	})
	defer cancel()
	cpu0 := processCPU()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	for range n {
		<-completed
	}
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	stopCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	if err := client.Stop(stopCtx); err != nil {
		return err
	}
	emit(map[string]any{
		"jobs":            n,
		"seconds":         elapsed.Seconds(),
		"jobs_per_second": float64(n) / elapsed.Seconds(),
		"cpu_us_per_job":  float64(cpu.Microseconds()) / float64(n),
	})
	return nil
}

// ---------------------------------------------------------------------------

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: riverinterop <subcommand> -url URL [flags]"))
	}
	cmd := os.Args[1]
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	url := fs.String("url", "", "database URL")
	direction := fs.String("direction", "up", "migrate: up or down")
	target := fs.Int("target-version", 0, "migrate: target version (down: -1 for all)")
	ids := fs.String("ids", "", "get: comma-separated job ids")
	id := fs.Int64("id", 0, "cancel: job id")
	queue := fs.String("queue", "", "pause/resume: queue name")
	var rf runFlags
	fs.StringVar(&rf.queues, "queues", "", "run: queue:max_workers,...")
	fs.StringVar(&rf.id, "client-id", "", "run: client ID")
	fs.StringVar(&rf.kinds, "kinds", "", "run: kinds to work")
	fs.BoolVar(&rf.fetchOnlyKnownKinds, "fetch-only-known-kinds", false, "run")
	fs.BoolVar(&rf.leaderElectionDisabled, "leader-election-disabled", false, "run")
	fs.BoolVar(&rf.reportLeader, "report-leader", false, "run: emit leadership changes")
	benchN := fs.Int("n", 20000, "bench: jobs to insert and work")
	benchWorkers := fs.Int("max-workers", 50, "bench: workers of the queue")
	benchCooldown := fs.Duration("fetch-cooldown", 0, "bench: River's FetchCooldown (0: its default)")
	if err := fs.Parse(os.Args[2:]); err != nil {
		fail(err)
	}
	if *url == "" {
		fail(errors.New("-url is required"))
	}
	ctx := context.Background()
	db, err := openDatabase(ctx, *url)
	if err != nil {
		fail(err)
	}
	defer db.close()

	err = func() error {
		if cmd == "run" {
			return cmdRun(ctx, db, rf)
		}
		if cmd == "bench" {
			return cmdBench(ctx, db, *benchN, *benchWorkers, *benchCooldown)
		}
		a, err := newAPI(db, &river.Config{Logger: quietLogger()})
		if err != nil {
			return err
		}
		switch cmd {
		case "migrate":
			return cmdMigrate(ctx, a, *direction, *target)
		case "versions":
			existing, err := a.existing(ctx)
			if err != nil {
				return err
			}
			emit(map[string]any{"versions": versionNumbers(existing)})
			return nil
		case "validate":
			res, err := a.validate(ctx)
			if err != nil {
				return err
			}
			msgs := res.Messages
			if msgs == nil {
				msgs = []string{}
			}
			emit(map[string]any{"ok": res.OK, "messages": msgs})
			return nil
		case "insert":
			return cmdInsert(ctx, a)
		case "get":
			return cmdGet(ctx, a, *ids)
		case "pause", "resume":
			if cmd == "pause" {
				err = a.pause(ctx, *queue)
			} else {
				err = a.resume(ctx, *queue)
			}
			if err != nil {
				return err
			}
			emit(map[string]any{"ok": true})
			return nil
		case "cancel":
			row, err := a.cancel(ctx, *id)
			if err != nil {
				return err
			}
			emit(toRow(row))
			return nil
		}
		return fmt.Errorf("unknown subcommand %q", cmd)
	}()
	if err != nil {
		db.close()
		fail(err)
	}
}
