// Package autopipe sends the Redis scripts of concurrent callers to Redis together, as one
// pipeline, instead of one round trip each.
//
// A [Pipeliner] has at most one round trip to Redis in flight. A call that finds none runs
// at once, on its caller's goroutine and exactly as [redis.Script.Run] would (so a lone caller
// pays nothing but a mutex); calls that arrive while a round trip is in flight queue, and go
// together in the next one, one pipeline sent by a goroutine that drains the queue until it is
// empty. Redis then reads and answers many calls per system call, and the client writes and
// reads once per batch instead of once per call; the batches grow with the load (the calls that
// arrive during one round trip), with no timer.
//
// Each call keeps its own result and error: a script's error (or NOSCRIPT, after which the
// call is sent again with EVAL, which loads the script) belongs to that call only; an error of
// the connection fails the calls of that batch. Contexts are honoured as go-redis honours them
// with its default options: a call whose context ends before it is sent is not sent and returns
// the context's error at once; a call on its way waits for its answer (which the client's
// ReadTimeout bounds), so that a script that ran is never reported as not run.
// It works with every [redis.UniversalClient], a Cluster client too (its pipelines are split by
// node).
package autopipe

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// MaxBatch caps the calls sent in one pipeline.
const MaxBatch = 128

// Pipeliner batches the script calls of concurrent callers on one client. It is safe for
// concurrent use; the zero value is not usable: see [New].
type Pipeliner struct {
	client redis.UniversalClient

	mu    sync.Mutex
	queue []*call
	busy  bool // a round trip is in flight (a direct call or a drain)
}

// call is one queued script call.
type call struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd    // the result, set before done is closed
	done   chan struct{} // closed once cmd is set
	taken  bool          // out of the queue, on its way (or answered); guarded by Pipeliner.mu
}

// New returns a Pipeliner sending to client (borrowed: it is not closed). It starts nothing.
func New(client redis.UniversalClient) *Pipeliner {
	return &Pipeliner{client: client}
}

// Run runs script with keys and args, as script.Run(ctx, client, keys, args...) does (EVALSHA,
// then EVAL if Redis does not have the script), sent with the calls of other callers when some
// are on their way. The returned command holds the reply or the error.
func (p *Pipeliner) Run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	p.mu.Lock()
	if !p.busy {
		p.busy = true
		p.mu.Unlock()
		cmd := script.Run(ctx, p.client, keys, args...)
		p.release()
		return cmd
	}
	c := &call{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	p.queue = append(p.queue, c)
	p.mu.Unlock()
	select {
	case <-c.done:
		return c.cmd
	case <-ctx.Done():
	}
	p.mu.Lock()
	if c.taken { // on its way: its answer comes (a drain answers every call it takes)
		p.mu.Unlock()
		<-c.done
		return c.cmd
	}
	for i, q := range p.queue {
		if q == c {
			p.queue = append(p.queue[:i], p.queue[i+1:]...)
			break
		}
	}
	p.mu.Unlock()
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(ctx.Err())
	return cmd
}

// Queued returns the number of calls waiting for the next round trip (for tests).
func (p *Pipeliner) Queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// release ends a round trip: the calls queued meanwhile go to a drain, else the Pipeliner is
// idle again.
func (p *Pipeliner) release() {
	p.mu.Lock()
	if len(p.queue) == 0 {
		p.busy = false
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	go p.drain()
}

// drain sends the queue in batches until it is empty. Should a batch panic, its calls are
// answered with an error and the Pipeliner is not left busy.
func (p *Pipeliner) drain() {
	for {
		p.mu.Lock()
		n := min(len(p.queue), MaxBatch)
		if n == 0 {
			p.busy = false
			p.mu.Unlock()
			return
		}
		batch := make([]*call, 0, n)
		var gone []*call // their context ended before they were sent
		for _, c := range p.queue[:n] {
			c.taken = true
			if c.ctx.Err() != nil {
				gone = append(gone, c)
			} else {
				batch = append(batch, c)
			}
		}
		clear(p.queue[:n])
		p.queue = p.queue[n:]
		if len(p.queue) == 0 {
			p.queue = nil // let the backing array go
		}
		p.mu.Unlock()
		for _, c := range gone {
			cmd := redis.NewCmd(c.ctx)
			cmd.SetErr(c.ctx.Err())
			c.answer(cmd)
		}
		p.send(batch)
	}
}

// send runs one batch and answers every call of it.
func (p *Pipeliner) send(batch []*call) {
	defer func() {
		if v := recover(); v != nil {
			for _, c := range batch {
				if c.cmd == nil {
					c.cmd = redis.NewCmd(c.ctx)
					c.cmd.SetErr(fmt.Errorf("autopipe: sending a batch panicked: %v", v))
					close(c.done)
				}
			}
		}
	}()
	switch len(batch) {
	case 0:
		return
	case 1:
		c := batch[0]
		c.answer(c.script.Run(c.ctx, p.client, c.keys, c.args...)) // as its caller would
		return
	}
	// The batch is not any one caller's: it ends by the client's own timeouts, not by a
	// caller's cancellation (the caller stops waiting instead).
	ctx := context.WithoutCancel(batch[0].ctx)
	cmds := p.pipeline(ctx, batch, func(c *call, pipe redis.Pipeliner) *redis.Cmd {
		return c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	})
	var missing []*call // a server did not have the script (restart, failover, SCRIPT FLUSH)
	for i, c := range batch {
		if err := cmds[i].Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			missing = append(missing, c)
			continue
		}
		c.answer(cmds[i])
	}
	if len(missing) == 0 {
		return
	}
	// EVAL loads the script on the server that runs it.
	for i, cmd := range p.pipeline(ctx, missing, func(c *call, pipe redis.Pipeliner) *redis.Cmd {
		return c.script.Eval(ctx, pipe, c.keys, c.args...)
	}) {
		missing[i].answer(cmd)
	}
}

// pipeline sends one command per call in one pipeline; each command carries its own error.
func (p *Pipeliner) pipeline(ctx context.Context, batch []*call, queue func(*call, redis.Pipeliner) *redis.Cmd) []*redis.Cmd {
	pipe := p.client.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, c := range batch {
		cmds[i] = queue(c, pipe)
	}
	_, _ = pipe.Exec(ctx) // every command holds its own error
	return cmds
}

// answer hands c its result.
func (c *call) answer(cmd *redis.Cmd) {
	c.cmd = cmd
	close(c.done)
}
