// The console's websocket (/ws/console/): opens it with the session's cookie, reconnects with
// backoff, and hands every event to the page. #live-status shows the connection's state.
(function () {
  "use strict";
  window.SentinelLive = {
    connect: function (onEvent) {
      const status = document.getElementById("live-status");
      const scheme = window.location.protocol === "https:" ? "wss" : "ws";
      let delay = 500;
      function show(state, text) {
        if (status) {
          status.dataset.state = state;
          status.textContent = text;
        }
      }
      function open() {
        const socket = new WebSocket(scheme + "://" + window.location.host + "/ws/console/");
        socket.onopen = function () {
          delay = 500;
          show("live", "live");
        };
        socket.onmessage = function (message) {
          onEvent(JSON.parse(message.data));
        };
        socket.onclose = function () {
          show("offline", "live: reconnecting…");
          window.setTimeout(open, delay);
          delay = Math.min(delay * 2, 10000);
        };
      }
      open();
    },
  };
})();
