package convert

import (
	"io"
	"sync"
)

// runAheadOnCPU makes CPU round-to-nearest modules run ahead of the writer like GPU ones, so
// that tests exercise the scheduling on a machine without a GPU.
var runAheadOnCPU = false

// aheadTask is work the writer will need, done before it gets there: quantizing and packing
// one module.
type aheadTask struct {
	run   func() error
	ready chan struct{} // closed when run returned
	err   error
}

func newAheadTask(run func() error) *aheadTask {
	return &aheadTask{run: run, ready: make(chan struct{})}
}

// wait blocks until the task has run and returns its error.
func (t *aheadTask) wait() error {
	<-t.ready
	return t.err
}

// ahead runs tasks in the order the writer will need them, `workers` at once, so that while
// the writer writes one module the next ones are already being read, staged and quantized.
// At most `window` tasks are started but not yet consumed (see done), which bounds the memory
// that finished results hold while they wait for the writer.
type ahead struct {
	window  chan struct{}
	workers chan struct{}
	stop    chan struct{}
	wg      sync.WaitGroup
}

// newAhead makes a scheduler; start gives it the tasks. Every started task must be passed to
// done once its result is consumed, and close must be called before the tasks' inputs go away.
func newAhead(workers, window int) *ahead {
	return &ahead{window: make(chan struct{}, max(1, window)), workers: make(chan struct{}, max(1, workers)),
		stop: make(chan struct{})}
}

// start runs tasks in the background, in order.
func (a *ahead) start(tasks []*aheadTask) {
	a.wg.Add(1)
	go a.dispatch(tasks)
}

// dispatch starts the tasks in order. It cannot deadlock with a writer that consumes them in
// the same order: when the writer waits for task i, every earlier task was consumed and gave
// its window place back, so task i gets one.
func (a *ahead) dispatch(tasks []*aheadTask) {
	defer a.wg.Done()
	for _, t := range tasks {
		select {
		case a.window <- struct{}{}:
		case <-a.stop:
			return
		}
		select {
		case a.workers <- struct{}{}:
		case <-a.stop:
			return
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			t.err = t.run()
			close(t.ready)
			<-a.workers
		}()
	}
}

// done gives a consumed task's window place back.
func (a *ahead) done() { <-a.window }

// close stops starting tasks and waits for those running: they read the input mapping and use
// the GPU, which are released after close.
func (a *ahead) close() {
	close(a.stop)
	a.wg.Wait()
}

// lockedWriter serializes writes to w, so that lines logged from several goroutines stay whole.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
