/* The Pod sandbox's pause process for the local cluster (tools/cluster.py): it holds the Pod's
 * namespaces, reaps every child re-parented to it (it is PID 1 when the Pod shares its PID namespace)
 * and exits 0 on SIGTERM or SIGINT. Built static (`gcc -static -O2`) so it runs in an empty image. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) { (void)sig; _exit(0); }

static void on_child(int sig) {
  (void)sig;
  int saved = errno;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  errno = saved;
}

int main(void) {
  struct sigaction stop = {0}, child = {0};
  stop.sa_handler = on_stop;
  child.sa_handler = on_child;
  child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  if (sigaction(SIGTERM, &stop, NULL) || sigaction(SIGINT, &stop, NULL) || sigaction(SIGCHLD, &child, NULL))
    return 1;
  for (;;) pause();
}
