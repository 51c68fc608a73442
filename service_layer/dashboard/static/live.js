// Refresh every [data-live] section in place from its fragment URL; stop once it says it is final.
(function () {
  "use strict";
  var indicator = document.getElementById("live-indicator");

  function follow(el) {
    var url = el.getAttribute("data-live");
    var every = parseInt(el.getAttribute("data-interval"), 10) || 2000;
    var refreshes = 0;

    function isFinal() {
      return el.querySelector('[data-final="true"]') !== null;
    }

    function tick() {
      if (isFinal()) {
        if (indicator) indicator.textContent = "final";
        return;
      }
      fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (r) {
          if (r.status === 401 || r.status === 403) { window.location.reload(); return null; }
          return r.ok ? r.text() : null;
        })
        .then(function (html) {
          if (html !== null && html !== undefined) {
            el.innerHTML = html;
            refreshes += 1;
            el.setAttribute("data-refreshes", String(refreshes));
            if (indicator) indicator.textContent = "live · " + new Date().toLocaleTimeString();
          }
        })
        .catch(function () { if (indicator) indicator.textContent = "reconnecting…"; })
        .then(function () { window.setTimeout(tick, every); });
    }

    window.setTimeout(tick, every);
  }

  Array.prototype.forEach.call(document.querySelectorAll("[data-live]"), follow);
})();
